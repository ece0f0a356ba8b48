//! Alerts as the API and the log show them: the recent ones (`/api/v1/alerts`, an open one
//! updated as it grows), a JSON line per start and end in the alert log, and ids that go on
//! counting per engine across re-attaches.

use std::{
    collections::{BTreeMap, VecDeque},
    fs::{File, OpenOptions},
    io::Write,
    path::Path,
    sync::Mutex,
};

use anyhow::{Context, Result};
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
    /// The moving mean of E that crossed the UCL.
    pub moving_mean: f64,
    /// The UCL.
    pub ucl: f64,
    /// The trigger iteration's duration and prediction, µs.
    pub duration_us: f64,
    /// Its prediction, µs.
    pub predicted_us: f64,
    /// Wall-clock end, ms since the epoch (None while open).
    pub ended_unix_ms: Option<u64>,
    /// Modelled iterations while it was open.
    pub iterations: u64,
}

/// The recent alerts, the alert log and the ids.
pub struct AlertLog {
    recent: Mutex<VecDeque<Alert>>,
    /// The last alert id of each pid: kept when an engine is let go, so that one attached
    /// again goes on counting instead of reusing ids.
    ids: Mutex<BTreeMap<u32, u64>>,
    log: Mutex<File>,
}

impl AlertLog {
    /// Opens (appends to) the alert log at `path`.
    pub fn open(path: &Path) -> Result<AlertLog> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| {
                format!(
                    "cannot open the alert log {}: set [state] alerts_log to a writable file",
                    path.display()
                )
            })?;
        Ok(AlertLog {
            recent: Mutex::new(VecDeque::new()),
            ids: Mutex::new(BTreeMap::new()),
            log: Mutex::new(log),
        })
    }

    /// The id of a new alert of engine `pid`.
    pub fn next_id(&self, pid: u32) -> u64 {
        let mut ids = self.ids.lock().expect("alert ids lock");
        let id = ids.entry(pid).or_default();
        *id += 1;
        *id
    }

    /// Records an alert event (`alert_start` or `alert_end`) in memory and in the log.
    pub fn event(&self, event: &str, alert: &Alert) {
        self.keep(alert);
        let mut line = serde_json::to_value(alert).expect("alerts serialise");
        line["event"] = event.into();
        let mut log = self.log.lock().expect("log lock");
        if let Err(e) = writeln!(log, "{line}").and_then(|_| log.flush()) {
            log::warn!("cannot append to the alert log: {e}");
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
