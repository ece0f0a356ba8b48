//! What `cargo xtask vllm up` serves on this machine: the dtype from what the CPU computes fast,
//! and the model's size from the decode step measured on the running server.
//!
//! The end-to-end tests were designed around decode steps of 20-70 ms at batch 8 (the "small"
//! model in bfloat16 on CPUs with AVX512-BF16). On a CPU without it, PyTorch runs bfloat16
//! matmuls about 40x slower than float32 (186 ms against 4.3 ms for 8x1024x4096 on an AVX2-only
//! EPYC), and even float32 leaves the small model's step at ~160 ms there: the same tests would
//! see a tenth of the iterations. So the dtype follows the CPU's flags and the size follows
//! the measured step.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
};

use anyhow::{Context, Result};
use serde_json::{json, Value};

/// The slowest decode step at batch 8 (median, vLLM's own timing) the tests were designed for.
pub const MAX_STEP_MS: f64 = 70.0;
/// What a smaller model is sized for when the measured step was too slow: below
/// [`MAX_STEP_MS`] with room for the estimate's error.
const TARGET_STEP_MS: f64 = 50.0;
/// The tokenizer's vocabulary (`xtask/vllm/make_model.py`).
const VOCAB: f64 = 32_000.0;

/// A random-init Llama shape `make_model.py` builds. Head dim 64 throughout.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Size {
    pub name: &'static str,
    pub layers: u32,
    pub hidden: u32,
    pub intermediate: u32,
    pub heads: u32,
    pub kv_heads: u32,
}

/// Largest first. "small" (~160M parameters) is the model the tests were designed on.
pub const SIZES: [Size; 4] = [
    Size::new("small", 8, 1024, 2816, 16, 8),
    Size::new("medium", 6, 768, 2048, 12, 6),
    Size::new("compact", 6, 512, 1408, 8, 4),
    Size::new("mini", 4, 384, 1024, 6, 3),
];

impl Size {
    const fn new(
        name: &'static str,
        layers: u32,
        hidden: u32,
        intermediate: u32,
        heads: u32,
        kv_heads: u32,
    ) -> Size {
        Size {
            name,
            layers,
            hidden,
            intermediate,
            heads,
            kv_heads,
        }
    }

    pub fn named(name: &str) -> Option<Size> {
        SIZES.into_iter().find(|s| s.name == name)
    }

    /// The weights a decode token is multiplied by (the input embedding is a lookup): per
    /// layer the q, k, v and o projections and the three MLP matrices, then the output head.
    /// At batch 8 a CPU decode step streams these weights, so its time scales with them.
    pub fn step_params(&self) -> f64 {
        let h = f64::from(self.hidden);
        let kv = h * f64::from(self.kv_heads) / f64::from(self.heads);
        let layer = h * (h + 2.0 * kv) + h * h + 3.0 * h * f64::from(self.intermediate);
        f64::from(self.layers) * layer + h * VOCAB
    }

    /// `make_model.py`'s shape arguments.
    pub fn args(&self) -> [String; 5] {
        [
            self.layers,
            self.hidden,
            self.intermediate,
            self.heads,
            self.kv_heads,
        ]
        .map(|n| n.to_string())
    }

    pub fn to_json(self) -> Value {
        json!({
            "size": self.name,
            "layers": self.layers,
            "hidden": self.hidden,
            "intermediate": self.intermediate,
            "step_params_m": (self.step_params() / 1e5).round() / 10.0,
        })
    }

    /// The size to try after this one measured `step_ms`: the largest smaller one whose step,
    /// scaled by its weights, is estimated at [`TARGET_STEP_MS`] or less; else the smallest.
    /// None when this is the smallest.
    pub fn smaller_for(&self, step_ms: f64) -> Option<Size> {
        let smaller: Vec<Size> = SIZES
            .into_iter()
            .skip_while(|s| s != self)
            .skip(1)
            .collect();
        let estimate = |s: &Size| step_ms * s.step_params() / self.step_params();
        smaller
            .iter()
            .find(|s| estimate(s) <= TARGET_STEP_MS)
            .or(smaller.last())
            .copied()
    }
}

/// What `/proc/cpuinfo` says of the CPU vLLM runs on.
pub struct Cpu {
    pub model: String,
    flags: BTreeSet<String>,
}

impl Cpu {
    pub fn read() -> Result<Cpu> {
        let text = fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
        Ok(Cpu::parse(&text))
    }

    fn parse(cpuinfo: &str) -> Cpu {
        let field = |name: &str| {
            cpuinfo.lines().find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == name).then(|| v.trim().to_string())
            })
        };
        Cpu {
            model: field("model name").unwrap_or_default(),
            flags: field("flags")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect(),
        }
    }

    /// Whether the CPU has bfloat16 dot products (AVX512-BF16 or AMX), which PyTorch's CPU
    /// kernels need to run bfloat16 at least as fast as float32.
    pub fn fast_bf16(&self) -> bool {
        self.flags.contains("avx512_bf16") || self.flags.contains("amx_bf16")
    }

    /// The dtype vLLM serves in: bfloat16 where the CPU computes it natively, else float32.
    pub fn dtype(&self) -> &'static str {
        if self.fast_bf16() {
            "bfloat16"
        } else {
            "float32"
        }
    }

    /// One line for a report: model, CPU count and the vector features that change speeds.
    pub fn describe(&self) -> String {
        let yes = |f: &str| if self.flags.contains(f) { "yes" } else { "no" };
        format!(
            "{}, {} CPUs, AVX-512: {}, AVX512-BF16: {}, AMX: {}",
            self.model,
            std::thread::available_parallelism().map_or(1, |n| n.get()),
            yes("avx512f"),
            yes("avx512_bf16"),
            yes("amx_bf16")
        )
    }

    pub fn to_json(&self) -> Value {
        json!({
            "model": self.model,
            "avx512f": self.flags.contains("avx512f"),
            "avx512_bf16": self.flags.contains("avx512_bf16"),
            "amx_bf16": self.flags.contains("amx_bf16"),
        })
    }
}

/// The median elapsed ms of vLLM's logged decode steps at batch 8 (no prefill in the step) in
/// `log` (`--enable-logging-iteration-details` lines), and how many there were.
pub fn decode_step_b8(log: &str) -> Option<(f64, usize)> {
    decode_step(log, Some(8)).map(|(ms, batches)| (ms, batches.values().sum()))
}

/// The median elapsed ms of vLLM's logged decode steps (no prefill in the step) in `log`, at
/// `batch` requests or, with `None`, at any batch; and how many steps there were at each batch.
///
/// A pipelined engine needs `None`: its batch queue schedules whichever requests are not in
/// a batch already in flight, so 8 concurrent requests run as micro-batches whose split (2
/// and 6, or 8 and none) depends on when each request arrived.
pub fn decode_step(log: &str, batch: Option<u64>) -> Option<(f64, BTreeMap<u64, usize>)> {
    let (ms, batches) = decode_elapsed(&vllm_log::parse(log), batch);
    (!ms.is_empty()).then(|| (ms[ms.len() / 2], batches))
}

/// The elapsed ms of the decode steps among `iterations` at `batch` requests (any batch with
/// `None`), sorted, and how many steps there were at each batch.
pub fn decode_elapsed(
    iterations: &[vllm_log::Iteration],
    batch: Option<u64>,
) -> (Vec<f64>, BTreeMap<u64, usize>) {
    let mut batches = BTreeMap::new();
    let mut ms: Vec<f64> = iterations
        .iter()
        .filter(|it| it.is_decode())
        .filter(|it| batch.is_none_or(|b| it.generation_requests == b))
        .inspect(|it| *batches.entry(it.generation_requests).or_default() += 1)
        .map(|it| it.elapsed_ms)
        .collect();
    ms.sort_by(f64::total_cmp);
    (ms, batches)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dtype_follows_the_cpus_bf16_support() {
        let cases = [
            ("fpu avx2 fma", "float32"),
            ("fpu avx2 avx512f avx512bw", "float32"),
            ("fpu avx2 avx512f avx512_bf16", "bfloat16"),
            ("fpu avx2 amx_bf16 amx_tile", "bfloat16"),
        ];
        for (flags, dtype) in cases {
            let cpu = Cpu::parse(&format!("model name\t: AMD EPYC\nflags\t\t: {flags}\n"));
            assert_eq!(cpu.dtype(), dtype, "{flags}");
            assert_eq!(cpu.model, "AMD EPYC");
        }
    }

    #[test]
    fn a_slow_step_picks_the_largest_smaller_model_estimated_to_fit() {
        let small = SIZES[0];
        // Sizes shrink.
        for w in SIZES.windows(2) {
            assert!(w[1].step_params() < w[0].step_params(), "{w:?}");
        }
        // Just over the limit: the next size down.
        assert_eq!(small.smaller_for(75.0).unwrap().name, "medium");
        // The AVX2-only EPYC's float32 step with the small model.
        let pick = small.smaller_for(160.0).unwrap();
        assert!(160.0 * pick.step_params() / small.step_params() <= TARGET_STEP_MS);
        assert_eq!(pick.name, "compact");
        // Hopelessly slow: the smallest; nothing below it.
        assert_eq!(small.smaller_for(10_000.0).unwrap().name, "mini");
        assert!(SIZES[3].smaller_for(10_000.0).is_none());
    }

    #[test]
    fn decode_steps_at_batch_8_are_read_from_vllms_iteration_log() {
        let log = "\
(EngineCore pid=1) INFO 11-26 05:01:02 [core.py:1] Iteration(10): 1 context requests, 40 context tokens, 7 generation requests, 7 generation tokens, 80.5 ms elapsed.
(EngineCore pid=1) INFO 11-26 05:01:02 [core.py:1] Iteration(11): 0 context requests, 0 context tokens, 8 generation requests, 8 generation tokens, 41.0 ms elapsed.
(EngineCore pid=1) INFO 11-26 05:01:02 [core.py:1] Iteration(12): 0 context requests, 0 context tokens, 8 generation requests, 8 generation tokens, 43.5 ms elapsed.
(EngineCore pid=1) INFO 11-26 05:01:02 [core.py:1] Iteration(13): 0 context requests, 0 context tokens, 8 generation requests, 8 generation tokens, 39.0 ms elapsed.
(EngineCore pid=1) INFO 11-26 05:01:02 [core.py:1] Iteration(14): 0 context requests, 0 context tokens, 4 generation requests, 4 generation tokens, 30.0 ms elapsed.
";
        assert_eq!(decode_step_b8(log), Some((41.0, 3)));
        assert_eq!(decode_step_b8("no iterations"), None);
        // A pipelined engine's micro-batches: every decode step, whatever its batch.
        let (ms, batches) = decode_step(log, None).unwrap();
        assert_eq!(ms, 41.0);
        assert_eq!(batches, BTreeMap::from([(4, 1), (8, 3)]));
    }
}
