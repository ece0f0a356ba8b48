//! Prefill / decode / mixed classification of an iteration, from its workload fields when
//! the profile provides them, from timing otherwise.

use serde::{Deserialize, Serialize};

/// What kind of work an iteration did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Only prompt processing.
    Prefill,
    /// Only one new token per request.
    Decode,
    /// Both in one batch (chunked prefill).
    Mixed,
}

impl Stage {
    /// Lower-case name (`prefill`, `decode`, `mixed`).
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Prefill => "prefill",
            Stage::Decode => "decode",
            Stage::Mixed => "mixed",
        }
    }
}

/// Workload facts an iteration may carry (all optional: profiles differ).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StageHints {
    /// Requests in the batch.
    pub batch: Option<i64>,
    /// Tokens computed in the iteration.
    pub tokens: Option<i64>,
    /// Requests scheduled for the first time (prefills).
    pub new_requests: Option<i64>,
    /// The engine's own stage, already mapped from its forward mode by the profile.
    pub mode: Option<Stage>,
}

/// Classifies iterations; remembers the previous one for the timing fallback.
#[derive(Debug, Clone)]
pub struct StageClassifier {
    idle_gap_ns: u64,
    prev_end_ns: Option<u64>,
}

impl StageClassifier {
    /// `idle_gap_ns`: with no workload fields, an iteration that starts after the engine sat
    /// idle this long is taken as a prefill (new requests arrived).
    pub fn new(idle_gap_ns: u64) -> Self {
        Self {
            idle_gap_ns,
            prev_end_ns: None,
        }
    }

    /// The stage of the iteration `[start_ns, end_ns]`.
    pub fn classify(&mut self, h: &StageHints, start_ns: u64, end_ns: u64) -> Stage {
        let after_idle = self
            .prev_end_ns
            .is_none_or(|p| start_ns.saturating_sub(p) > self.idle_gap_ns);
        self.prev_end_ns = Some(end_ns);
        if let Some(m) = h.mode {
            return m;
        }
        match (h.batch, h.tokens, h.new_requests) {
            // Every request of the batch is new.
            (Some(b), _, Some(n)) if n > 0 && n >= b => Stage::Prefill,
            (Some(b), _, Some(n)) if n > 0 && n < b => Stage::Mixed,
            // No new request, but more tokens than requests: a prefill chunk continues.
            (Some(b), Some(t), _) if t > b => {
                if b <= 1 {
                    Stage::Prefill
                } else {
                    Stage::Mixed
                }
            }
            (Some(_), Some(_), _) => Stage::Decode,
            (Some(_), None, Some(0)) => Stage::Decode,
            _ if after_idle => Stage::Prefill,
            _ => Stage::Decode,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(batch: i64, tokens: i64, new: i64) -> StageHints {
        StageHints {
            batch: Some(batch),
            tokens: Some(tokens),
            new_requests: Some(new),
            mode: None,
        }
    }

    #[test]
    fn from_fields() {
        let mut c = StageClassifier::new(50_000_000);
        assert_eq!(c.classify(&h(1, 300, 1), 0, 1), Stage::Prefill);
        assert_eq!(c.classify(&h(8, 8, 0), 2, 3), Stage::Decode);
        assert_eq!(c.classify(&h(8, 300, 1), 4, 5), Stage::Mixed);
        assert_eq!(c.classify(&h(1, 200, 0), 6, 7), Stage::Prefill);
        assert_eq!(c.classify(&h(4, 200, 0), 8, 9), Stage::Mixed);
        let mode = StageHints {
            mode: Some(Stage::Decode),
            ..h(4, 200, 4)
        };
        assert_eq!(c.classify(&mode, 10, 11), Stage::Decode);
    }

    #[test]
    fn timing_fallback() {
        let mut c = StageClassifier::new(50_000_000);
        let none = StageHints::default();
        assert_eq!(c.classify(&none, 0, 30_000_000), Stage::Prefill);
        assert_eq!(c.classify(&none, 30_100_000, 60_000_000), Stage::Decode);
        assert_eq!(c.classify(&none, 500_000_000, 530_000_000), Stage::Prefill);
    }
}
