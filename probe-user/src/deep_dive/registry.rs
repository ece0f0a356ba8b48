//! The daemon's deep dives: requests waiting for the capture loop, their records (what
//! `/api/v1/deep-dives` lists) and the admission rules (one at a time, at most N per hour).

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};

/// Records kept for `/api/v1/deep-dives`.
const KEPT: usize = 64;

/// Where a deep dive is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    /// Accepted, waiting for the capture loop.
    Queued,
    /// Capturing (normal window first, when one was asked for).
    Capturing,
    /// Captured; the trace and report are being written.
    Writing,
    /// Trace and report written.
    Done,
    /// Failed (see `error`).
    Failed,
}

/// A top suspect, as listed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SuspectBrief {
    /// Event name.
    pub name: String,
    /// Its score.
    pub score: f64,
    /// Its share of the cycle grew by this much.
    pub delta_beta: f64,
}

/// One deep dive.
#[derive(Debug, Clone, Serialize)]
pub struct Record {
    /// Sequence number since the daemon started.
    pub id: u64,
    /// The engine.
    pub pid: u32,
    /// `alert <id>` or `api`.
    pub trigger: String,
    /// Where it is.
    pub state: Phase,
    /// Wall clock when it was asked for, ms since the epoch.
    pub requested_unix_ms: u64,
    /// Length of the deep-dive window, ms.
    pub duration_ms: u64,
    /// Length of the normal window recorded first, ms (0: the rolling reference is used).
    pub baseline_ms: u64,
    /// The Perfetto trace, once written.
    pub trace: Option<String>,
    /// The JSON report, once written.
    pub report: Option<String>,
    /// The most likely cause in a few words.
    pub summary: Option<String>,
    /// The top suspect's category, when one stands out.
    pub category: Option<String>,
    /// The first suspects.
    pub suspects: Vec<SuspectBrief>,
    /// Why it failed.
    pub error: Option<String>,
    /// The wall-clock instant its deep-dive window was to open, ns since the epoch (a serving
    /// group's nodes share it; the capture starts a lead before it); None: at once.
    pub start_at_unix_ns: Option<u64>,
    /// When its capture started, ns since the epoch.
    pub started_unix_ns: Option<u64>,
    /// The serving group whose deep dive this is (all its nodes share `start_at_unix_ns`).
    pub group: Option<String>,
    /// The deep-dive window by the trace's clock snapshot, ns since the epoch.
    pub window_unix_ns: Option<[u64; 2]>,
    /// The trace's clock snapshot: CLOCK_REALTIME − CLOCK_MONOTONIC, ns.
    pub clock_offset_ns: Option<i64>,
}

/// A deep dive the capture loop should start.
#[derive(Debug, Clone)]
pub struct Request {
    /// Its record's id.
    pub id: u64,
    /// The engine.
    pub pid: u32,
    /// Deep-dive window.
    pub duration: Duration,
    /// Normal window recorded first (zero: the rolling reference).
    pub baseline: Duration,
    /// Not before this wall-clock instant, ns since the epoch.
    pub start_at_unix_ns: Option<u64>,
}

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Another deep dive is queued or capturing.
    Busy(u64),
    /// `max_per_hour` were started in the last hour.
    RateLimited(usize),
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Busy(id) => write!(
                f,
                "deep dive {id} is still capturing; one runs at a time: retry when it is done"
            ),
            Refusal::RateLimited(n) => write!(
                f,
                "{n} deep dives were taken in the last hour ([deep_dive] max_per_hour): retry later"
            ),
        }
    }
}

/// Requests, records and the admission state.
#[derive(Debug, Default)]
pub struct Registry {
    records: VecDeque<Record>,
    pending: VecDeque<Request>,
    started: VecDeque<Instant>,
    next_id: u64,
}

impl Registry {
    /// Admits a deep dive of `pid` unless one is queued or capturing, or `max_per_hour` were
    /// admitted in the last hour. An admitted HTTP request (`queue`) waits for the capture
    /// loop; an alert's deep dive (not queued) starts at once. Returns the record's id.
    pub fn admit(
        &mut self,
        pid: u32,
        trigger: String,
        duration: Duration,
        baseline: Duration,
        max_per_hour: usize,
        queue: bool,
    ) -> Result<u64, Refusal> {
        if let Some(r) = self
            .records
            .iter()
            .find(|r| matches!(r.state, Phase::Queued | Phase::Capturing))
        {
            return Err(Refusal::Busy(r.id));
        }
        let hour = Duration::from_secs(3600);
        while self.started.front().is_some_and(|t| t.elapsed() >= hour) {
            self.started.pop_front();
        }
        if self.started.len() >= max_per_hour {
            return Err(Refusal::RateLimited(self.started.len()));
        }
        self.started.push_back(Instant::now());
        self.next_id += 1;
        let id = self.next_id;
        self.records.push_back(Record {
            id,
            pid,
            trigger,
            state: if queue {
                Phase::Queued
            } else {
                Phase::Capturing
            },
            requested_unix_ms: crate::os::clock::unix_ms(),
            duration_ms: duration.as_millis() as u64,
            baseline_ms: baseline.as_millis() as u64,
            trace: None,
            report: None,
            summary: None,
            category: None,
            suspects: Vec::new(),
            error: None,
            start_at_unix_ns: None,
            started_unix_ns: None,
            group: None,
            window_unix_ns: None,
            clock_offset_ns: None,
        });
        if self.records.len() > KEPT {
            self.records.pop_front();
        }
        if queue {
            self.pending.push_back(Request {
                id,
                pid,
                duration,
                baseline,
                start_at_unix_ns: None,
            });
        }
        Ok(id)
    }

    /// Makes queued request `id` serving group `group`'s deep dive, waiting for the group's
    /// wall-clock instant `unix_ns` (None: at once).
    pub fn for_group(&mut self, id: u64, group: &str, unix_ns: Option<u64>) {
        if let Some(r) = self.pending.iter_mut().find(|r| r.id == id) {
            r.start_at_unix_ns = unix_ns;
        }
        self.update(id, |rec| {
            rec.start_at_unix_ns = unix_ns;
            rec.group = Some(group.to_string());
        });
    }

    /// When the next queued request's capture is to begin, `lead` before its instant, unix ns
    /// (0: at once); None when none is queued.
    pub fn next_due_unix_ns(&self, lead: Duration) -> Option<u64> {
        let lead = lead.as_nanos() as u64;
        self.pending
            .front()
            .map(|r| r.start_at_unix_ns.map_or(0, |t| t.saturating_sub(lead)))
    }

    /// The next queued request whose capture is due at `now_unix_ns` (`lead` before its
    /// instant), now capturing.
    pub fn next_request(&mut self, now_unix_ns: u64, lead: Duration) -> Option<Request> {
        let due = self.next_due_unix_ns(lead)? <= now_unix_ns;
        if !due {
            return None;
        }
        let r = self.pending.pop_front()?;
        self.update(r.id, |rec| {
            rec.state = Phase::Capturing;
            rec.started_unix_ns = Some(now_unix_ns);
        });
        Some(r)
    }

    /// Changes record `id` (if still kept).
    pub fn update(&mut self, id: u64, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self.records.iter_mut().find(|r| r.id == id) {
            f(r);
        }
    }

    /// Marks record `id` failed with `why`.
    pub fn fail(&mut self, id: u64, why: String) {
        self.update(id, |r| {
            r.state = Phase::Failed;
            r.error = Some(why);
        });
    }

    /// Every kept record, oldest first.
    pub fn records(&self) -> Vec<Record> {
        self.records.iter().cloned().collect()
    }

    /// Record `id`.
    pub fn get(&self, id: u64) -> Option<Record> {
        self.records.iter().find(|r| r.id == id).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn one_at_a_time_and_at_most_n_per_hour() {
        let mut r = Registry::default();
        let a = r.admit(7, "api".into(), S, S, 2, true).unwrap();
        assert_eq!(
            r.admit(7, "alert 1".into(), S, S, 2, false),
            Err(Refusal::Busy(a))
        );
        let req = r.next_request(0, Duration::ZERO).unwrap();
        assert_eq!((req.id, req.pid, req.baseline), (a, 7, S));
        assert_eq!(r.get(a).unwrap().state, Phase::Capturing);
        assert!(r.next_request(0, Duration::ZERO).is_none());
        r.update(a, |x| x.state = Phase::Writing);
        let b = r
            .admit(7, "alert 1".into(), S, Duration::ZERO, 2, false)
            .unwrap();
        assert_eq!(r.get(b).unwrap().state, Phase::Capturing);
        assert!(
            r.next_request(0, Duration::ZERO).is_none(),
            "an alert's deep dive is not queued"
        );
        r.fail(b, "engine exited".into());
        assert_eq!(
            r.admit(7, "api".into(), S, S, 2, true),
            Err(Refusal::RateLimited(2))
        );
        assert_eq!(r.records().len(), 2);
        assert_eq!(r.get(b).unwrap().error.as_deref(), Some("engine exited"));
    }

    /// A request given a start instant waits for its lead before it, then records when its
    /// capture began.
    #[test]
    fn a_scheduled_request_waits_for_its_instant() {
        let mut r = Registry::default();
        let a = r
            .admit(7, "alertmanager".into(), S, Duration::ZERO, 6, true)
            .unwrap();
        r.for_group(a, "g", Some(5_000));
        let lead = Duration::from_nanos(1_000);
        assert_eq!(r.next_due_unix_ns(lead), Some(4_000));
        assert!(r.next_request(3_999, lead).is_none());
        assert_eq!(r.get(a).unwrap().state, Phase::Queued);
        let req = r.next_request(4_002, lead).unwrap();
        assert_eq!(req.start_at_unix_ns, Some(5_000));
        let rec = r.get(a).unwrap();
        assert_eq!(
            (rec.state, rec.start_at_unix_ns, rec.started_unix_ns),
            (Phase::Capturing, Some(5_000), Some(4_002))
        );
        assert_eq!(rec.group.as_deref(), Some("g"));
    }
}
