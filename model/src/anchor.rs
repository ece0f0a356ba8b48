//! Finds the iteration anchor of an unknown framework: the watched function that is called
//! often and whose duration is stable (LatencyPrism §4.2.1). Known frameworks name it in
//! their profile instead.

use serde::Serialize;

/// What was observed of one candidate function over a window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CallStats {
    /// The function.
    pub func: String,
    /// Calls in the window.
    pub calls: u64,
    /// Mean duration, ns.
    pub mean_ns: f64,
    /// Coefficient of variation of the duration.
    pub cv: f64,
}

impl CallStats {
    /// Builds the statistics from a function's call durations (ns).
    pub fn from_durations(func: &str, durations_ns: &[u64]) -> Self {
        let n = durations_ns.len().max(1) as f64;
        let mean = durations_ns.iter().map(|&d| d as f64).sum::<f64>() / n;
        let var = durations_ns
            .iter()
            .map(|&d| (d as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        Self {
            func: func.to_string(),
            calls: durations_ns.len() as u64,
            mean_ns: mean,
            cv: if mean > 0.0 {
                var.sqrt() / mean
            } else {
                f64::INFINITY
            },
        }
    }
}

/// Picks the anchor: among functions called at least `min_calls` times with a mean
/// duration of at least `min_mean_ns` (an iteration runs a model forward, not a helper) and a
/// coefficient of variation of at most `max_cv`, the one with the most calls per unit of
/// variability, `calls / (1 + cv)`. Returns its index in `candidates`.
pub fn discover(
    candidates: &[CallStats],
    min_calls: u64,
    min_mean_ns: f64,
    max_cv: f64,
) -> Option<usize> {
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.calls >= min_calls && c.mean_ns >= min_mean_ns && c.cv.is_finite() && c.cv <= max_cv
        })
        .max_by(|(_, a), (_, b)| {
            let sa = a.calls as f64 / (1.0 + a.cv);
            let sb = b.calls as f64 / (1.0 + b.cv);
            sa.total_cmp(&sb)
        })
        .map(|(i, _)| i)
}

/// The most variable duration (coefficient of variation) an anchor of a healthy engine may
/// have. An iteration's duration follows its workload; a call whose spread exceeds its mean
/// waits on something else (a queue, a pipe, a lock). Per-request calls of a batching server outnumber its
/// per-batch forward pass: LitServe's `put_response` (a pipe write per request, cv 1.33) was
/// called 5 times as often as `predict` (cv 0.35) and won on calls alone.
pub const MAX_CV: f64 = 1.0;

/// Calls a candidate needs in a discovery window, and the shortest mean duration (ns) it may
/// have (an iteration runs a model forward, not a helper), to be chosen.
pub const MIN_CALLS: u64 = 20;
pub const MIN_MEAN_NS: f64 = 5e5;

/// [`discover`] with [`MIN_CALLS`] and [`MIN_MEAN_NS`] over each function's call durations
/// (ns), in the order given: the chosen function's statistics.
pub fn discover_in<'a>(
    durations: impl IntoIterator<Item = (&'a str, &'a [u64])>,
    max_cv: f64,
) -> Option<CallStats> {
    let mut stats: Vec<CallStats> = durations
        .into_iter()
        .map(|(f, d)| CallStats::from_durations(f, d))
        .collect();
    discover(&stats, MIN_CALLS, MIN_MEAN_NS, max_cv).map(|i| stats.swap_remove(i))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefers_frequent_stable_forward_sized_calls() {
        let step = CallStats::from_durations("m:step", &[30_000_000; 100]);
        // As frequent but erratic (a request handler).
        let erratic: Vec<u64> = (0..100).map(|i| 1_000_000 + i * i * 100_000).collect();
        let handler = CallStats::from_durations("m:handle", &erratic);
        // More frequent, but a tiny helper.
        let helper = CallStats::from_durations("m:helper", &[2_000; 1000]);
        // Stable but rare (startup).
        let load = CallStats::from_durations("m:load", &[900_000_000; 2]);
        let all = [handler, helper, step, load];
        assert_eq!(discover(&all, 20, 1_000_000.0, MAX_CV), Some(2));
        assert_eq!(discover(&all[..1], 200, 1_000_000.0, MAX_CV), None);
        // The same choice from raw durations with the default thresholds.
        let erratic_ref = &erratic[..];
        let found = discover_in(
            [
                ("m:handle", erratic_ref),
                ("m:helper", &[2_000; 1000][..]),
                ("m:step", &[30_000_000; 100][..]),
                ("m:load", &[900_000_000; 2][..]),
            ],
            MAX_CV,
        );
        assert_eq!(found.map(|s| s.func), Some("m:step".to_string()));
        assert!(discover_in([("m:helper", &[2_000; 1000][..])], MAX_CV).is_none());
        // A per-request call of a batching server: five times as frequent as its forward
        // pass and long enough, but erratic (it waits on a pipe).
        let piped: Vec<u64> = (0..5_000)
            .map(|i| if i % 5 == 0 { 2_500_000 } else { 100_000 })
            .collect();
        let forward: Vec<u64> = (0..1_000).map(|i| 3_000_000 + (i % 7) * 300_000).collect();
        let found = discover_in(
            [("m:put_response", &piped[..]), ("m:predict", &forward[..])],
            MAX_CV,
        );
        assert_eq!(found.map(|s| s.func), Some("m:predict".to_string()));
    }
}
