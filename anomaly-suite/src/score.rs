//! Scoring detections against injection intervals (LatencyPrism Table 5): each modelled
//! iteration is labelled abnormal when it overlaps its trial's injection, and flagged by
//! each detection strategy from its prediction error E = max(0, (y − ŷ)/(y + ε)).

use serde::Serialize;

/// One modelled iteration.
#[derive(Debug, Clone, Copy)]
pub struct Iteration {
    /// Start, µs (any clock shared with the injections).
    pub start_us: f64,
    /// Duration, µs.
    pub duration_us: f64,
    /// The baseline's prediction, µs.
    pub predicted_us: f64,
}

impl Iteration {
    /// End, µs.
    pub fn end_us(&self) -> f64 {
        self.start_us + self.duration_us
    }

    /// The positive prediction error E.
    pub fn error(&self) -> f64 {
        ((self.duration_us - self.predicted_us) / (self.duration_us + 1.0)).max(0.0)
    }
}

/// One trial: the span scored and the injection inside it.
#[derive(Debug, Clone, Copy)]
pub struct Trial {
    /// Scored span start, µs.
    pub from_us: f64,
    /// Scored span end, µs.
    pub to_us: f64,
    /// Injection start, µs.
    pub inject_from_us: f64,
    /// Injection end, µs.
    pub inject_to_us: f64,
    /// End of the recovery grace, µs (`inject_to_us`: none): iterations that start between
    /// the injection's end and this are in neither class, since the engine and a moving mean
    /// both take a moment to recover.
    pub grace_to_us: f64,
}

/// A detection strategy.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Strategy {
    /// E of the iteration alone above the UCL.
    DynamicPoint,
    /// Moving mean of E over W iterations above the UCL (the sentinel's rule).
    DynamicWindow,
    /// Moving mean of E above a fixed threshold (the paper uses 15 %).
    FixedWindow(f64),
}

impl Strategy {
    /// The name used in tables.
    pub fn name(&self) -> String {
        match self {
            Strategy::DynamicPoint => "Dynamic-Point".into(),
            Strategy::DynamicWindow => "Dynamic-Window".into(),
            Strategy::FixedWindow(t) => format!("Fixed-Window {:.0} %", t * 100.0),
        }
    }
}

/// Scores of one strategy over some trials.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Scores {
    /// Abnormal iterations flagged.
    pub tp: u64,
    /// Normal iterations flagged.
    pub fp: u64,
    /// Normal iterations not flagged.
    pub tn: u64,
    /// Abnormal iterations not flagged.
    pub fn_: u64,
    /// tp / (tp + fp).
    pub precision: f64,
    /// tp / (tp + fn).
    pub recall: f64,
    /// Harmonic mean of precision and recall.
    pub f1: f64,
    /// fp / (fp + tn).
    pub fpr: f64,
    /// Trials with at least one abnormal iteration flagged.
    pub detected: usize,
    /// Trials scored.
    pub trials: usize,
    /// Mean over detected trials of abnormal iterations before the first flagged one.
    pub lag_iterations: Option<f64>,
    /// Mean over detected trials of injection start to the end of the first flagged
    /// abnormal iteration, ms.
    pub lag_ms: Option<f64>,
}

/// The flags of `strategy` over a continuous stream (the moving mean spans trial edges, as
/// it does in the live sentinel).
pub fn flags(stream: &[Iteration], strategy: Strategy, ucl: f64, window: usize) -> Vec<bool> {
    let errors: Vec<f64> = stream.iter().map(Iteration::error).collect();
    let mut sum = 0.0;
    errors
        .iter()
        .enumerate()
        .map(|(i, &e)| {
            sum += e;
            if i >= window {
                sum -= errors[i - window];
            }
            let mean = sum / (i + 1).min(window) as f64;
            match strategy {
                Strategy::DynamicPoint => e > ucl,
                Strategy::DynamicWindow => mean > ucl,
                Strategy::FixedWindow(t) => mean > t,
            }
        })
        .collect()
}

/// The moving mean of E over `window` iterations, per iteration.
pub fn moving_mean(stream: &[Iteration], window: usize) -> Vec<f64> {
    let errors: Vec<f64> = stream.iter().map(Iteration::error).collect();
    (0..errors.len())
        .map(|i| {
            let from = (i + 1).saturating_sub(window);
            errors[from..=i].iter().sum::<f64>() / (i + 1 - from) as f64
        })
        .collect()
}

/// Scores `flags` (from [`flags`] over `stream`) against `trials`.
pub fn score(stream: &[Iteration], flags: &[bool], trials: &[Trial]) -> Scores {
    let mut s = Scores {
        trials: trials.len(),
        ..Scores::default()
    };
    let (mut lag_it, mut lag_ms) = (Vec::new(), Vec::new());
    for t in trials {
        let mut abnormal_seen = 0u64;
        let mut detected = false;
        for (it, &flag) in stream.iter().zip(flags) {
            if it.start_us < t.from_us || it.end_us() > t.to_us {
                continue;
            }
            let abnormal = it.end_us() > t.inject_from_us && it.start_us < t.inject_to_us;
            if !abnormal && it.start_us >= t.inject_to_us && it.start_us < t.grace_to_us {
                continue;
            }
            match (abnormal, flag) {
                (true, true) => s.tp += 1,
                (true, false) => s.fn_ += 1,
                (false, true) => s.fp += 1,
                (false, false) => s.tn += 1,
            }
            if abnormal && flag && !detected {
                detected = true;
                lag_it.push(abnormal_seen as f64);
                lag_ms.push((it.end_us() - t.inject_from_us) / 1e3);
            }
            if abnormal {
                abnormal_seen += 1;
            }
        }
        s.detected += usize::from(detected);
    }
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    s.precision = ratio(s.tp, s.tp + s.fp);
    s.recall = ratio(s.tp, s.tp + s.fn_);
    s.f1 = if s.precision + s.recall > 0.0 {
        2.0 * s.precision * s.recall / (s.precision + s.recall)
    } else {
        0.0
    };
    s.fpr = ratio(s.fp, s.fp + s.tn);
    let mean = |v: &[f64]| (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64);
    s.lag_iterations = mean(&lag_it);
    s.lag_ms = mean(&lag_ms);
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(slow_from: usize, slow_to: usize) -> Vec<Iteration> {
        (0..100)
            .map(|i| Iteration {
                start_us: i as f64 * 1000.0,
                duration_us: if (slow_from..slow_to).contains(&i) {
                    990.0
                } else {
                    500.0
                },
                predicted_us: 500.0,
            })
            .collect()
    }

    #[test]
    fn point_and_window_strategies_score_an_injected_span() {
        // Iterations 40..60 are twice as slow (E ≈ 0.49); the injection covers exactly them.
        let s = stream(40, 60);
        let trial = Trial {
            from_us: 0.0,
            to_us: 100_000.0,
            inject_from_us: 40_000.0,
            inject_to_us: 59_999.0,
            grace_to_us: 59_999.0,
        };
        let point = score(&s, &flags(&s, Strategy::DynamicPoint, 0.2, 10), &[trial]);
        assert_eq!((point.tp, point.fp, point.fn_), (20, 0, 0));
        assert_eq!(point.f1, 1.0);
        assert_eq!(point.lag_iterations, Some(0.0));
        // The moving mean of 10 crosses 0.2 at the 5th slow iteration and stays above it for
        // 5 normal ones after the span.
        let window = score(&s, &flags(&s, Strategy::DynamicWindow, 0.2, 10), &[trial]);
        assert_eq!((window.tp, window.fn_, window.fp), (16, 4, 5));
        assert_eq!(window.lag_iterations, Some(4.0));
        assert!((window.lag_ms.unwrap() - 4.99).abs() < 0.01);
        assert!((window.fpr - 5.0 / 80.0).abs() < 1e-12);
        let fixed = score(
            &s,
            &flags(&s, Strategy::FixedWindow(0.6), 0.2, 10),
            &[trial],
        );
        assert_eq!((fixed.tp, fixed.fp, fixed.detected), (0, 0, 0));
        assert_eq!(fixed.lag_ms, None);
        assert_eq!(moving_mean(&s, 10)[0], 0.0);
        // A grace of 5 iterations after the injection takes the window's 5 late flags out
        // of the normal class: no false positive left, 5 fewer normal iterations.
        let graced = Trial {
            grace_to_us: 64_999.0,
            ..trial
        };
        let window_graced = score(&s, &flags(&s, Strategy::DynamicWindow, 0.2, 10), &[graced]);
        assert_eq!(
            (window_graced.tp, window_graced.fp, window_graced.tn),
            (16, 0, 75)
        );
        assert_eq!(window_graced.fpr, 0.0);
    }
}
