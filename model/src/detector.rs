//! Turns per-iteration errors into alerts: a trailing moving mean of E over W iterations
//! compared with the UCL, with hysteresis so one alert covers one episode.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

/// Detector parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DetectorParams {
    /// W: iterations in the moving mean.
    pub window: usize,
    /// An alert starts once the moving mean has been above the UCL for this many
    /// consecutive iterations (1: at the first crossing).
    pub start_after: usize,
    /// An alert ends once the moving mean stays at or below `clear_ratio · UCL` ...
    pub clear_ratio: f64,
    /// ... for this many consecutive iterations.
    pub clear_after: usize,
}

impl Default for DetectorParams {
    fn default() -> Self {
        Self {
            window: 10,
            start_after: 5,
            clear_ratio: 0.8,
            clear_after: 10,
        }
    }
}

/// What an observation changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    /// Nothing.
    None,
    /// The moving mean crossed the UCL: an alert starts.
    Started,
    /// The moving mean stayed low long enough: the alert ends.
    Ended,
}

/// The moving mean and alert state.
#[derive(Debug, Clone)]
pub struct Detector {
    params: DetectorParams,
    window: VecDeque<f64>,
    sum: f64,
    active: bool,
    /// Consecutive iterations above the UCL (before an alert) or at or below the clear
    /// level (during one).
    above: usize,
    calm: usize,
}

impl Detector {
    /// An idle detector.
    pub fn new(params: DetectorParams) -> Self {
        Self {
            params: DetectorParams {
                window: params.window.max(1),
                ..params
            },
            window: VecDeque::with_capacity(params.window.max(1)),
            sum: 0.0,
            active: false,
            above: 0,
            calm: 0,
        }
    }

    /// Adds one iteration's error; returns the moving mean (once the window is full) and
    /// what changed.
    pub fn push(&mut self, error: f64, ucl: f64) -> (Option<f64>, Transition) {
        if self.window.len() == self.params.window {
            self.sum -= self.window.pop_front().unwrap_or(0.0);
        }
        self.window.push_back(error);
        self.sum += error;
        if self.window.len() < self.params.window {
            return (None, Transition::None);
        }
        let mean = (self.sum / self.window.len() as f64).max(0.0);
        let t = if !self.active {
            self.above = if mean > ucl { self.above + 1 } else { 0 };
            if self.above >= self.params.start_after.max(1) {
                self.active = true;
                self.above = 0;
                self.calm = 0;
                Transition::Started
            } else {
                Transition::None
            }
        } else if mean <= self.params.clear_ratio * ucl {
            self.calm += 1;
            if self.calm >= self.params.clear_after {
                self.active = false;
                Transition::Ended
            } else {
                Transition::None
            }
        } else {
            self.calm = 0;
            Transition::None
        };
        (Some(mean), t)
    }

    /// Whether an alert is open.
    pub fn active(&self) -> bool {
        self.active
    }

    /// Forgets the window (after a model change or a gap in the stream); an open alert stays open.
    pub fn reset_window(&mut self) {
        self.window.clear();
        self.sum = 0.0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_once_and_ends_after_calm() {
        let mut d = Detector::new(DetectorParams {
            start_after: 1,
            ..DetectorParams::default()
        });
        let mut events = Vec::new();
        let series = [0.01; 20].into_iter().chain([0.6; 15]).chain([0.0; 40]);
        for (i, e) in series.enumerate() {
            let (_, t) = d.push(e, 0.1);
            if t != Transition::None {
                events.push((i, t));
            }
        }
        // Mean exceeds 0.1 once 2 of the 10 values are 0.6 (i = 21); it is at most 0.08 once
        // only one 0.6 is left (i = 43) and the alert ends on the 10th such iteration.
        assert_eq!(
            events,
            vec![(21, Transition::Started), (52, Transition::Ended)]
        );
    }

    #[test]
    fn no_mean_before_the_window_fills_and_a_short_crossing_is_ignored() {
        let mut d = Detector::new(DetectorParams::default());
        for _ in 0..9 {
            assert_eq!(d.push(1.0, 0.1), (None, Transition::None));
        }
        // Above the UCL from the 10th value on: the 5th consecutive crossing starts the alert.
        for _ in 0..4 {
            assert_eq!(d.push(1.0, 0.1).1, Transition::None);
        }
        assert_eq!(d.push(1.0, 0.1).1, Transition::Started);
        assert!(d.active());
        // A crossing shorter than start_after never alerts (W = 1: the mean is the value).
        let mut d = Detector::new(DetectorParams {
            window: 1,
            ..DetectorParams::default()
        });
        let series = [0.0; 3].into_iter().chain([0.5; 4]).chain([0.0; 5]);
        assert!(series
            .map(|e| d.push(e, 0.15).1)
            .all(|t| t == Transition::None));
        let t: Vec<Transition> = [0.5; 5].into_iter().map(|e| d.push(e, 0.15).1).collect();
        assert_eq!(t[4], Transition::Started);
    }
}
