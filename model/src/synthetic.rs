//! Deterministic synthetic decode iterations, for tests and benchmarks: latency grows with
//! batch and KV context like a decode step does, with ±1.5 % noise.

use crate::{baseline::Sample, features::Workload};

/// xorshift64: a tiny deterministic generator (no dependency, same stream on every machine).
pub struct XorShift(u64);

impl XorShift {
    /// A generator from `seed` (any value).
    pub fn new(seed: u64) -> Self {
        Self(seed | 1)
    }

    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// `n` decode samples: B in 1..=32, prompt 16..516 tokens, 0..256 generated, duration
/// 25 ms + 0.4 ms per request + 80 ns per KV token.
pub fn decode_samples(n: usize, seed: u64) -> Vec<Sample> {
    let mut r = XorShift::new(seed);
    (0..n)
        .map(|_| {
            let batch = (1.0 + r.uniform() * 31.0).round();
            let input_len = 16.0 + r.uniform() * 500.0;
            let output_len = r.uniform() * 256.0;
            let clean = 25_000.0 + 400.0 * batch + 0.08 * batch * (input_len + output_len);
            Sample {
                workload: Workload {
                    batch,
                    input_len,
                    output_len,
                    tokens: batch,
                    overlap_tokens: 0.0,
                },
                duration_us: clean * (1.0 + 0.03 * (r.uniform() - 0.5)),
            }
        })
        .collect()
}
