//! An iteration's workload and the features the baseline predicts its duration from.

use serde::{Deserialize, Serialize};

/// Feature names, in the order of [`Workload::features`].
pub const FEATURE_NAMES: [&str; 6] = [
    "batch",
    "input_len",
    "output_len",
    "w_kv",
    "tokens",
    "overlap_tokens",
];

/// What one engine iteration computed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    /// Requests in the batch (B).
    pub batch: f64,
    /// Mean prompt length of the batch's requests (L_in).
    pub input_len: f64,
    /// Mean tokens generated so far by the batch's requests (L_out).
    pub output_len: f64,
    /// Tokens computed in this iteration (B for a plain decode step).
    pub tokens: f64,
    /// Tokens of the batches the engine dispatched beside this one while it was in flight (a
    /// pipelined loop such as vLLM's batch queue); 0 for a loop that runs one batch at a
    /// time. A pipelined engine's batch that runs alone waits for every stage, one that
    /// shares the pipeline waits only for what is left of it: the same batch takes about
    /// twice as long alone.
    #[serde(default)]
    pub overlap_tokens: f64,
}

impl Workload {
    /// `[B, L_in, L_out, W_kv, tokens, overlap_tokens]` with W_kv = B·(L_in + L_out), the
    /// KV-cache tokens the iteration's attention reads (the LatencyPrism paper's main
    /// feature).
    #[inline]
    pub fn features(&self) -> [f64; 6] {
        [
            self.batch,
            self.input_len,
            self.output_len,
            self.batch * (self.input_len + self.output_len),
            self.tokens,
            self.overlap_tokens,
        ]
    }
}
