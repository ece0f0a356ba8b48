//! State the sentinel thread updates and the HTTP handlers read: metrics, per-engine status,
//! recent alerts (also appended to the JSON-lines alert log) and the deep dives' book.

use std::{
    collections::{BTreeMap, VecDeque},
    fs::{File, OpenOptions},
    io::Write,
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::{Context, Result};
use serde::Serialize;

use crate::{api::metrics::Metrics, deep_dive::book::Book};

/// Alerts kept for `/api/v1/alerts`.
const RECENT_ALERTS: usize = 256;

/// One alert episode.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// Sequence number of the engine's alerts since the daemon started (with `pid`, the key).
    pub id: u64,
    /// The engine process.
    pub pid: u32,
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

/// What `/api/v1/status` reports per engine.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    /// Engine pid.
    pub pid: u32,
    /// Profile applied.
    pub framework: String,
    /// CPython version.
    pub python: String,
    /// The iteration anchor (`module:qualname`), once known.
    pub anchor: Option<String>,
    /// Model fingerprint key.
    pub fingerprint: String,
    /// `warming`, `fitting` or `fitted`.
    pub model_state: String,
    /// Healthy samples held for training.
    pub training_samples: usize,
    /// Warm-up target.
    pub warmup_samples: usize,
    /// Samples of the fitted model.
    pub model_samples: Option<usize>,
    /// Out-of-fold MAPE of the fitted model, %.
    pub model_mape_pct: Option<f64>,
    /// The UCL in force.
    pub ucl: Option<f64>,
    /// Iterations by stage.
    pub iterations: BTreeMap<String, u64>,
    /// Probe records lost.
    pub lost_records: u64,
    /// Whether an alert is open.
    pub anomaly_active: bool,
    /// The GPU plane: `on: <pid> (CUPTI <version>), ...` or `off: <why>`.
    pub gpu_plane: String,
    /// Iterations with GPU figures.
    pub gpu_iterations: u64,
    /// Mean void share of the last 100 iterations with GPU figures.
    pub gpu_void_ratio: Option<f64>,
}

/// Shared between the sentinel thread and the HTTP server.
pub struct Shared {
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Per-engine status, by pid.
    pub engines: Mutex<BTreeMap<u32, EngineStatus>>,
    /// Engines that could not be attached, with why.
    pub attach_errors: Mutex<BTreeMap<u32, String>>,
    /// The deep dives' records, the capture running now and the normal references.
    pub deep_dive: Arc<Book>,
    alerts: Mutex<VecDeque<Alert>>,
    /// The last alert id of each pid: kept when an engine is let go, so that one attached
    /// again goes on counting instead of reusing ids.
    alert_ids: Mutex<BTreeMap<u32, u64>>,
    log: Mutex<File>,
}

impl Shared {
    /// Opens (appends to) the alert log.
    pub fn new(alerts_log: &Path) -> Result<Self> {
        if let Some(dir) = alerts_log.parent() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(alerts_log)
            .with_context(|| {
                format!(
                    "cannot open the alert log {}: set [state] alerts_log to a writable file",
                    alerts_log.display()
                )
            })?;
        Ok(Self {
            metrics: Metrics::new(),
            engines: Mutex::new(BTreeMap::new()),
            attach_errors: Mutex::new(BTreeMap::new()),
            deep_dive: Arc::default(),
            alerts: Mutex::new(VecDeque::new()),
            alert_ids: Mutex::new(BTreeMap::new()),
            log: Mutex::new(log),
        })
    }

    /// The id of a new alert of engine `pid`.
    pub fn next_alert_id(&self, pid: u32) -> u64 {
        let mut ids = self.alert_ids.lock().expect("alert ids lock");
        let id = ids.entry(pid).or_default();
        *id += 1;
        *id
    }

    /// Records an alert event (`alert_start` or `alert_end`) in memory and in the log.
    pub fn alert_event(&self, event: &str, alert: &Alert) {
        self.keep_alert(alert);
        let mut line = serde_json::to_value(alert).expect("alerts serialise");
        line["event"] = event.into();
        let mut log = self.log.lock().expect("log lock");
        if let Err(e) = writeln!(log, "{line}").and_then(|_| log.flush()) {
            log::warn!("cannot append to the alert log: {e}");
        }
    }

    /// Updates (or adds) an alert among the recent ones, without an alert-log line: an open
    /// alert's iteration count as it grows.
    pub fn keep_alert(&self, alert: &Alert) {
        let mut recent = self.alerts.lock().expect("alerts lock");
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
    pub fn alerts(&self) -> Vec<Alert> {
        self.alerts
            .lock()
            .expect("alerts lock")
            .iter()
            .cloned()
            .collect()
    }
}
