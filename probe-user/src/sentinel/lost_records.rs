//! Probe records an engine's threads could not write because their lane of the ring was full,
//! and drains that found a lane's counters gone backwards (records of that lane wait until it
//! catches up): counted in the metrics at once, and warned of at most every [`WARNING_PERIOD`]
//! with the counts since the last warning.

use std::time::{Duration, Instant};

use log::warn;
use prometheus::IntCounterVec;

use crate::api::{metrics::ProcessLabels, state::Shared};

/// Lost records are warned of at most this often.
const WARNING_PERIOD: Duration = Duration::from_secs(10);

/// The lost-record account of engine `pid`.
pub struct LostRecords {
    pid: u32,
    labels: ProcessLabels,
    /// The ring's loss counter when last read.
    seen: u64,
    /// The ring's resync counter when last read.
    resyncs_seen: u64,
    /// Lost records and resyncs not yet in a warning, and when the last warning was.
    unreported: u64,
    unreported_resyncs: u64,
    warned_at: Option<Instant>,
}

impl LostRecords {
    pub fn new(pid: u32, labels: ProcessLabels) -> LostRecords {
        LostRecords {
            pid,
            labels,
            seen: 0,
            resyncs_seen: 0,
            unreported: 0,
            unreported_resyncs: 0,
            warned_at: None,
        }
    }

    /// Takes in the ring's loss and resync counters, both since the attach.
    pub fn update(&mut self, lost: u64, resyncs: u64, shared: &Shared) {
        let labels = self.labels.with(&[]);
        self.unreported += gain(&shared.metrics.lost_records, &labels, &mut self.seen, lost);
        self.unreported_resyncs += gain(
            &shared.metrics.ring_resyncs,
            &labels,
            &mut self.resyncs_seen,
            resyncs,
        );
        if self.unreported > 0 && self.warned_at.is_none_or(|t| t.elapsed() >= WARNING_PERIOD) {
            warn!(
                "engine {}: {} probe records lost: a thread's lane of the probe ring was full (the daemon fell more than [sentinel] probe_ring_records records behind it); the iterations in them are missing from the sentinel and the export",
                self.pid, self.unreported
            );
            self.unreported = 0;
            self.warned_at = Some(Instant::now());
        }
        if self.unreported_resyncs > 0
            && self.warned_at.is_none_or(|t| t.elapsed() >= WARNING_PERIOD)
        {
            warn!(
                "engine {}: {} drains found a lane of the probe ring with its write sequence below its read one: something in the engine wrote over the ring's counters; that lane's records are read again once it catches up",
                self.pid, self.unreported_resyncs
            );
            self.unreported_resyncs = 0;
            self.warned_at = Some(Instant::now());
        }
    }

    /// Records lost since the attach.
    pub fn total(&self) -> u64 {
        self.seen
    }
}

/// Counts in `counter` what the ring's counter gained since `seen` (and moves `seen` up);
/// returns the gain.
fn gain(counter: &IntCounterVec, labels: &[&str], seen: &mut u64, now: u64) -> u64 {
    let gain = now.saturating_sub(*seen);
    if gain > 0 {
        counter.with_label_values(labels).inc_by(gain);
        *seen = now;
    }
    gain
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each counter takes what the ring's counter gained since the last read, once.
    #[test]
    fn counters_take_each_gain_once() {
        let dir = std::env::temp_dir().join(format!("stallscope-lost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let shared = Shared::new(&dir.join("alerts.jsonl")).unwrap();
        let labels = ProcessLabels::new(7, &Default::default());
        let mut account = LostRecords::new(7, labels.clone());
        // (ring's lost, ring's resyncs) read in turn, and the counters expected after each.
        let reads = [
            (0, 0, 0, 0),
            (5, 0, 5, 0),
            (5, 2, 5, 2),
            (9, 3, 9, 3),
            (9, 3, 9, 3),
        ];
        for (lost, resyncs, want_lost, want_resyncs) in reads {
            account.update(lost, resyncs, &shared);
            let m = &shared.metrics;
            assert_eq!(
                m.lost_records.with_label_values(&labels.with(&[])).get(),
                want_lost
            );
            assert_eq!(
                m.ring_resyncs.with_label_values(&labels.with(&[])).get(),
                want_resyncs
            );
        }
        assert_eq!(account.total(), 9);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
