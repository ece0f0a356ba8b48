//! Probe records an engine's threads could not write because their lane of the ring was full:
//! counted in the metrics at once, and warned of at most every [`WARNING_PERIOD`] with the
//! count since the last warning.

use std::time::{Duration, Instant};

use log::warn;

use crate::api::{metrics::ProcessLabels, state::Shared};

/// Lost records are warned of at most this often.
const WARNING_PERIOD: Duration = Duration::from_secs(10);

/// The lost-record account of engine `pid`.
pub struct LostRecords {
    pid: u32,
    labels: ProcessLabels,
    /// The ring's loss counter when last read.
    seen: u64,
    /// Lost records not yet in a warning, and when the last warning was.
    unreported: u64,
    warned_at: Option<Instant>,
}

impl LostRecords {
    pub fn new(pid: u32, labels: ProcessLabels) -> LostRecords {
        LostRecords {
            pid,
            labels,
            seen: 0,
            unreported: 0,
            warned_at: None,
        }
    }

    /// Takes in the ring's loss counter, `lost` records since the attach.
    pub fn update(&mut self, lost: u64, shared: &Shared) {
        if lost > self.seen {
            shared
                .metrics
                .lost_records
                .with_label_values(&self.labels.with(&[]))
                .inc_by(lost - self.seen);
            self.unreported += lost - self.seen;
            self.seen = lost;
        }
        if self.unreported > 0 && self.warned_at.is_none_or(|t| t.elapsed() >= WARNING_PERIOD) {
            warn!(
                "engine {}: {} probe records lost: a thread's lane of the probe ring was full (the daemon fell more than [sentinel] probe_ring_records records behind it); the iterations in them are missing from the sentinel and the export",
                self.pid, self.unreported
            );
            self.unreported = 0;
            self.warned_at = Some(Instant::now());
        }
    }

    /// Records lost since the attach.
    pub fn total(&self) -> u64 {
        self.seen
    }
}
