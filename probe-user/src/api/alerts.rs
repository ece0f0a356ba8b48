//! Alerts as the API and the log show them: the recent ones (`/api/v1/alerts`, an open one
//! updated as it grows), a JSON line per start and end in the alert log, and ids that go on
//! counting per engine across re-attaches.

use std::{
    collections::{BTreeMap, VecDeque},
    fs::File,
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use model::Workload;
use pod_identity::Identity;
use serde::Serialize;

/// Alerts kept for `/api/v1/alerts`.
const RECENT_ALERTS: usize = 256;

/// One alert episode.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// Sequence number of the engine's alerts since the daemon started (with `pid`, the key).
    pub id: u64,
    /// The engine process.
    pub pid: u32,
    /// The engine's pod and container.
    pub identity: Identity,
    /// Wall-clock start, ms since the epoch.
    pub started_unix_ms: u64,
    /// CLOCK_MONOTONIC end of the iteration that crossed the UCL, ns.
    pub trigger_iteration_end_ns: u64,
    /// From that iteration's end to the alert being raised, µs.
    pub detection_latency_us: f64,
    /// The moving mean of E that crossed the threshold.
    pub moving_mean: f64,
    /// How much slower than predicted the window that raised it ran: its iterations' summed
    /// durations over their summed predictions (at least the threshold's slowdown).
    pub window_slowdown: f64,
    /// The threshold the moving mean crossed: the UCL, or the error of `min_slowdown` when that
    /// is larger (the field keeps its name for the API's readers).
    pub ucl: f64,
    /// The trigger iteration's duration, µs.
    pub duration_us: f64,
    /// Its prediction, µs.
    pub predicted_us: f64,
    /// What it computed.
    pub workload: Workload,
    /// Its stage (`decode`, `prefill`, `mixed`).
    pub stage: &'static str,
    /// How far the window's iterations ran over their prediction.
    pub severity: Severity,
    /// Wall-clock end, ms since the epoch (None while open).
    pub ended_unix_ms: Option<u64>,
    /// Modelled iterations while it was open.
    pub iterations: u64,
    /// How much slower than predicted those iterations ran: the sum of their durations over
    /// the sum of their predictions (1.3: 30 % slower).
    pub slowdown: f64,
    /// How long it lasted, ms (once it ended).
    pub lasted_ms: Option<u64>,
}

/// An alert's severity, from how much slower than predicted the window that raised it ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Over the UCL, but the window's iterations took less than twice their prediction.
    Warning,
    /// The window's iterations took twice their prediction or more.
    Critical,
}

impl Severity {
    /// The severity of an alert whose window ran `window_slowdown` times its prediction.
    pub fn of(window_slowdown: f64) -> Severity {
        if window_slowdown >= 2.0 {
            Severity::Critical
        } else {
            Severity::Warning
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Warning => "warning",
            Severity::Critical => "critical",
        }
    }
}

/// Something told of every alert event as the alert log records it (the OTLP export).
pub trait AlertSink: Send + Sync {
    /// `event` is `alert_start` or `alert_end`.
    fn alert(&self, event: &str, alert: &Alert);
}

/// The recent alerts, the alert log and the ids.
pub struct AlertLog {
    recent: Mutex<VecDeque<Alert>>,
    /// The last alert id of each pid: kept when an engine is let go, so that one attached
    /// again goes on counting instead of reusing ids.
    ids: Mutex<BTreeMap<u32, u64>>,
    log: Mutex<File>,
    /// Lines the log could not take.
    failures: prometheus::IntCounter,
    sinks: Mutex<Vec<Arc<dyn AlertSink>>>,
}

impl AlertLog {
    /// Opens (appends to) the alert log at `path`; a line it cannot take later is counted in
    /// `failures`.
    pub fn open(path: &Path, failures: prometheus::IntCounter) -> Result<AlertLog> {
        if let Some(dir) = path.parent() {
            sys_util::private::create_dir(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let log = sys_util::private::append_file(path).with_context(|| {
            format!(
                "cannot open the alert log {}: set [state] alerts_log to a writable file",
                path.display()
            )
        })?;
        Ok(AlertLog {
            failures,
            recent: Mutex::new(VecDeque::new()),
            ids: Mutex::new(BTreeMap::new()),
            log: Mutex::new(log),
            sinks: Mutex::new(Vec::new()),
        })
    }

    /// The id of a new alert of engine `pid`.
    pub fn next_id(&self, pid: u32) -> u64 {
        let mut ids = self.ids.lock().expect("alert ids lock");
        let id = ids.entry(pid).or_default();
        *id += 1;
        *id
    }

    /// Tells `sink` of every alert event from now on.
    pub fn subscribe(&self, sink: Arc<dyn AlertSink>) {
        self.sinks.lock().expect("alert sinks lock").push(sink);
    }

    /// Records an alert event (`alert_start` or `alert_end`) in memory, in the log and with
    /// every sink.
    pub fn event(&self, event: &str, alert: &Alert) {
        self.keep(alert);
        for sink in self.sinks.lock().expect("alert sinks lock").iter() {
            sink.alert(event, alert);
        }
        let mut line = serde_json::to_value(alert).expect("alerts serialise");
        line["event"] = event.into();
        let mut log = self.log.lock().expect("log lock");
        if let Err(e) = writeln!(log, "{line}").and_then(|_| log.flush()) {
            self.failures.inc();
            log::warn!("cannot append to the alert log: {e} (counted in stallscope_state_write_failures_total)");
        }
    }

    /// Updates (or adds) an alert among the recent ones, without an alert-log line: an open
    /// alert's iteration count as it grows.
    pub fn keep(&self, alert: &Alert) {
        let mut recent = self.recent.lock().expect("alerts lock");
        match recent
            .iter_mut()
            .rev()
            .find(|a| a.pid == alert.pid && a.id == alert.id)
        {
            Some(a) => *a = alert.clone(),
            None => {
                recent.push_back(alert.clone());
                if recent.len() > RECENT_ALERTS {
                    recent.pop_front();
                }
            }
        }
    }

    /// Recent alerts, oldest first.
    pub fn recent(&self) -> Vec<Alert> {
        self.recent
            .lock()
            .expect("alerts lock")
            .iter()
            .cloned()
            .collect()
    }
}
