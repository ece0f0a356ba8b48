//! Online recalibration of a fitted baseline: its predictions scaled by the median ratio of
//! observed to predicted duration over the engine's recent healthy iterations.
//!
//! A tree ensemble predicts a constant beyond the workloads it was fitted on, and an engine's
//! load moves on after a fit (contexts grow as requests run; the host's other work comes and
//! goes), so a model can run low for minutes, and every iteration's error then starts from
//! that bias. The median ratio follows such a shift within `window` healthy iterations and
//! removes it, while a slowdown of a few seconds moves a median over many times its length
//! little, and iterations under or next to an alert never enter it. The factor is bounded by
//! `max`, so a slowdown that creeps up for longer than the window is absorbed at most that far.
//!
//! It only ever raises predictions (a factor of at least 1). A factor below 1 lowers every
//! prediction, and nothing can raise it again while that alerts: iterations under an alert
//! never enter the window, and no refit starts during one. A burst of iterations faster than
//! predicted (seen under a GC storm on vLLM: ~120 iterations in 2 s, a fifth of the window)
//! then leaves healthy steps 1.2x "slower" than the lowered predictions, alerting until the
//! engine restarts. A model that runs high only misses slowdowns smaller than its bias, as it
//! would without recalibration.

use std::collections::VecDeque;

/// The recalibration of one engine's current model.
#[derive(Debug, Clone)]
pub struct Recalibration {
    window: usize,
    max: f64,
    ratios: VecDeque<f64>,
    since_update: usize,
    factor: f64,
}

impl Recalibration {
    /// Over the last `window` healthy iterations (0: off), bounded to `[1, 1+max]`.
    pub fn new(window: usize, max: f64) -> Self {
        Self {
            window,
            max: max.max(0.0),
            ratios: VecDeque::with_capacity(window),
            since_update: 0,
            factor: 1.0,
        }
    }

    /// The factor the model's predictions are multiplied by.
    pub fn factor(&self) -> f64 {
        self.factor
    }

    /// Takes a healthy iteration's observed and (uncalibrated) predicted durations.
    pub fn push(&mut self, observed_us: f64, predicted_us: f64) {
        if self.window == 0 || predicted_us <= 0.0 {
            return;
        }
        if self.ratios.len() == self.window {
            self.ratios.pop_front();
        }
        self.ratios.push_back(observed_us / predicted_us);
        self.since_update += 1;
        // The median is recomputed every tenth of the window, once half of it is filled.
        if self.ratios.len() >= self.window / 2 && self.since_update >= (self.window / 10).max(1) {
            self.since_update = 0;
            let mut v: Vec<f64> = self.ratios.iter().copied().collect();
            let mid = v.len() / 2;
            let (_, median, _) = v.select_nth_unstable_by(mid, f64::total_cmp);
            self.factor = median.clamp(1.0, 1.0 + self.max);
        }
    }

    /// Starts over (a new model has biases of its own).
    pub fn reset(&mut self) {
        self.ratios.clear();
        self.since_update = 0;
        self.factor = 1.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The factor follows a lasting shift, moves little for a short one, stays within its
    /// bound, and waits for half a window before moving at all.
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
            let mut r = Recalibration::new(1000, 0.2);
            for (n, ratio) in &ratios {
                for _ in 0..*n {
                    r.push(100.0 * ratio, 100.0);
                }
            }
            assert!(
                (want_lo - 1e-9..=want_hi + 1e-9).contains(&r.factor()),
                "{ratios:?}: {}",
                r.factor()
            );
        }
        let mut off = Recalibration::new(0, 0.2);
        off.push(200.0, 100.0);
        assert_eq!(off.factor(), 1.0);
        let mut r = Recalibration::new(10, 0.5);
        (0..10).for_each(|_| r.push(130.0, 100.0));
        assert!((r.factor() - 1.3).abs() < 1e-9);
        r.reset();
        assert_eq!(r.factor(), 1.0);
    }
}
