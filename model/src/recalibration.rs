//! Online recalibration of a fitted baseline: its predictions scaled by the median ratio of
//! observed to predicted duration over the engine's recent healthy iterations.
//!
//! A tree ensemble predicts a constant beyond the workloads it was fitted on, and an engine's
//! load moves on after a fit (contexts grow as requests run; the host's other work comes and
//! goes), so a model can run low for minutes, and every iteration's error then starts from
//! that bias. The median ratio follows such a shift within its window of healthy iterations
//! and removes it, while a slowdown of a few seconds moves a median over many times its length
//! little, and iterations under or next to an alert never enter it. The factor is bounded by
//! `max`, so a slowdown that creeps up for longer than the window is absorbed at most that far.
//!
//! The window is a span of time by default: counted in iterations, 200 are about 10 s of
//! vLLM's decode steps on a CPU (~19 a second between its prefills) but 0.2 s of a 1 ms GPU
//! loop, which would absorb a slowdown under the alert threshold within a tenth of a second
//! and then judge the next one from it.
//!
//! It only ever raises predictions (a factor of at least 1). A factor below 1 lowers every
//! prediction, and nothing can raise it again while that alerts: iterations under an alert
//! never enter the window, and no refit starts during one. A burst of iterations faster than
//! predicted (seen under a GC storm on vLLM: ~120 iterations in 2 s, a fifth of the window)
//! then leaves healthy steps 1.2x "slower" than the lowered predictions, alerting until the
//! engine restarts. A model that runs high only misses slowdowns smaller than its bias, as it
//! would without recalibration.

use std::collections::VecDeque;

use crate::detector::Span;

/// The recalibration of one engine's current model.
#[derive(Debug, Clone)]
pub struct Recalibration {
    over: Span,
    max: f64,
    /// (end ns, observed / predicted) of the healthy iterations in the window.
    ratios: VecDeque<(u64, f64)>,
    /// The first iteration's end since the last reset, ns.
    first_ns: Option<u64>,
    /// The iterations and time since the factor was last recomputed.
    since_update: usize,
    updated_ns: u64,
    factor: f64,
}

/// A window in time never takes a median of fewer iterations than this: a slow engine's few
/// steps are one episode's noise.
pub const MIN_TIME_RATIOS: usize = 10;

impl Recalibration {
    /// Over the healthy iterations of the last `over` (a count, or a span of time: the same
    /// seconds of an engine's pace whatever its step; `Iterations(0)`: off), bounded to
    /// `[1, 1+max]`.
    pub fn new(over: Span, max: f64) -> Self {
        Self {
            over,
            max: max.max(0.0),
            ratios: VecDeque::new(),
            first_ns: None,
            since_update: 0,
            updated_ns: 0,
            factor: 1.0,
        }
    }

    /// The factor the model's predictions are multiplied by.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// Takes a healthy iteration that ended at `end_ns` (CLOCK_MONOTONIC) with its observed
    /// and (uncalibrated) predicted durations.
    pub fn push(&mut self, end_ns: u64, observed_us: f64, predicted_us: f64) {
        if matches!(self.over, Span::Iterations(0) | Span::Micros(0)) || predicted_us <= 0.0 {
            return;
        }
        let first = *self.first_ns.get_or_insert(end_ns);
        self.ratios.push_back((end_ns, observed_us / predicted_us));
        self.since_update += 1;
        // The median is recomputed every tenth of the window, once half of it is filled.
        let due = match self.over {
            Span::Iterations(n) => {
                while self.ratios.len() > n {
                    self.ratios.pop_front();
                }
                self.ratios.len() >= n / 2 && self.since_update >= (n / 10).max(1)
            }
            Span::Micros(us) => {
                let span_ns = us.saturating_mul(1000);
                let from = end_ns.saturating_sub(span_ns);
                while self.ratios.front().is_some_and(|(t, _)| *t < from) {
                    self.ratios.pop_front();
                }
                self.ratios.len() >= MIN_TIME_RATIOS
                    && end_ns.saturating_sub(first) >= span_ns / 2
                    && end_ns.saturating_sub(self.updated_ns) >= span_ns / 10
            }
        };
        if due {
            self.since_update = 0;
            self.updated_ns = end_ns;
            let mut v: Vec<f64> = self.ratios.iter().map(|r| r.1).collect();
            let mid = v.len() / 2;
            let (_, median, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
            self.factor = median.clamp(1.0, 1.0 + self.max);
        }
    }

    /// Starts over (a new model has biases of its own).
    pub fn reset(&mut self) {
        self.ratios.clear();
        self.first_ns = None;
        self.since_update = 0;
        self.updated_ns = 0;
        self.factor = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes `ratios` ((count, observed/predicted) runs) of steps `step_ms` long; the factor.
    fn factor_after(over: Span, step_ms: u64, ratios: &[(usize, f64)]) -> f64 {
        let mut r = Recalibration::new(over, 0.2);
        let mut t = 0;
        for (n, ratio) in ratios {
            for _ in 0..*n {
                t += step_ms * 1_000_000;
                r.push(t, 100.0 * ratio, 100.0);
            }
        }
        r.factor()
    }

    /// The factor follows a lasting shift, moves little for a short one, stays within its
    /// bound, and waits for half a window before moving at all; in time, alike at any step.
    #[test]
    fn follows_lasting_shifts_within_its_bound() {
        for (ratios, want_lo, want_hi) in [
            // A lasting +12 %: followed.
            (vec![(1000, 1.12)], 1.11, 1.13),
            // 900 healthy iterations at 1.0, then 100 at 2.0 (a short slowdown): the median
            // stays at 1.0.
            (vec![(900, 1.0), (100, 2.0)], 0.99, 1.01),
            // A lasting +60 %: bounded to +20 %.
            (vec![(1000, 1.6)], 1.2, 1.2),
            // Faster than predicted: predictions are never lowered.
            (vec![(1000, 0.7)], 1.0, 1.0),
            // Fast iterations filling most of the window: 1, not below.
            (vec![(1000, 1.0), (600, 0.6)], 1.0, 1.0),
            // Fewer than half a window: not yet.
            (vec![(499, 1.3)], 1.0, 1.0),
        ] {
            // 1,000 iterations, and 10 s at 10 ms and at 1 ms steps (the counts scaled).
            for (over, step_ms, scale) in [
                (Span::Iterations(1000), 10, 1),
                (Span::Micros(10_000_000), 10, 1),
                (Span::Micros(10_000_000), 1, 10),
            ] {
                let runs: Vec<(usize, f64)> = ratios.iter().map(|&(n, x)| (n * scale, x)).collect();
                let f = factor_after(over, step_ms, &runs);
                assert!(
                    (want_lo - 1e-9..=want_hi + 1e-9).contains(&f),
                    "{over:?} at {step_ms} ms steps, {runs:?}: {f}"
                );
            }
        }
        assert_eq!(factor_after(Span::Iterations(0), 10, &[(10, 2.0)]), 1.0);
        assert_eq!(factor_after(Span::Micros(0), 10, &[(10, 2.0)]), 1.0);
        // A time window of a slow engine waits for MIN_TIME_RATIOS steps: 9 steps of 1 s
        // over a 10 s window are not enough.
        assert_eq!(
            factor_after(Span::Micros(10_000_000), 1000, &[(9, 1.3)]),
            1.0
        );
        assert!((factor_after(Span::Micros(10_000_000), 1000, &[(10, 1.3)]) - 1.2).abs() < 1e-9);
        let mut r = Recalibration::new(Span::Iterations(10), 0.5);
        (0..10).for_each(|i| r.push(i, 130.0, 100.0));
        assert!((r.factor() - 1.3).abs() < 1e-9);
        r.reset();
        assert_eq!(r.factor(), 1.0);
    }
}
