//! State the sentinel thread updates and the HTTP handlers read: metrics, per-engine status,
//! attach errors, the alerts and the deep dives' book.

use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
};

use anyhow::Result;
use serde::Serialize;

use super::{alerts::AlertLog, metrics::Metrics};
use crate::deep_dive::book::Book;

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
    /// Alerts: the recent ones and the alert log.
    pub alerts: AlertLog,
}

impl Shared {
    /// Opens (appends to) the alert log.
    pub fn new(alerts_log: &Path) -> Result<Self> {
        Ok(Self {
            metrics: Metrics::new(),
            engines: Mutex::new(BTreeMap::new()),
            attach_errors: Mutex::new(BTreeMap::new()),
            deep_dive: Arc::default(),
            alerts: AlertLog::open(alerts_log)?,
        })
    }
}
