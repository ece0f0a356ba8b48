//! Each attached engine's status as its sentinel last published it, and the engines that could
//! not be attached with why: written by the daemon's loop, read by the HTTP API.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Mutex,
};

use pod_identity::Identity;
use serde::Serialize;

/// What `/api/v1/status` reports per engine.
#[derive(Debug, Clone, Serialize)]
pub struct EngineStatus {
    /// Engine pid.
    pub pid: u32,
    /// Its pod and container.
    pub identity: Identity,
    /// Profile applied.
    pub framework: String,
    /// The parallel rank its process title names (`DP0_TP1`), if any.
    pub rank: Option<String>,
    /// CPython version.
    pub python: String,
    /// The iteration anchor (`module:qualname`), once known.
    pub anchor: Option<String>,
    /// Model fingerprint key.
    pub fingerprint: String,
    /// `warming` (collecting the first training set), `fitting` (the first fit runs) or
    /// `fitted` (a model predicts).
    pub model_state: String,
    /// Whether a refit runs beside the model that predicts.
    pub refitting: bool,
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
    /// The factor the model's predictions are scaled by ([sentinel] recalibrate_over).
    pub recalibration: Option<f64>,
    /// Iterations by stage.
    pub iterations: BTreeMap<String, u64>,
    /// Decode iterations learned instead of judged: their batch size was outside the model's
    /// training range.
    pub unseen_batch_iterations: u64,
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

/// The engines' statuses and attach errors, each behind its own lock.
#[derive(Default)]
pub struct EngineBoard {
    statuses: Mutex<BTreeMap<u32, EngineStatus>>,
    attach_errors: Mutex<BTreeMap<u32, String>>,
}

impl EngineBoard {
    /// Replaces the engine's status.
    pub fn publish(&self, status: EngineStatus) {
        self.statuses
            .lock()
            .expect("status lock")
            .insert(status.pid, status);
    }

    /// Removes a detached engine's status.
    pub fn withdraw(&self, pid: u32) {
        self.statuses.lock().expect("status lock").remove(&pid);
    }

    /// Records why the engine could not be attached (replacing an earlier reason).
    pub fn attach_failed(&self, pid: u32, why: String) {
        self.attach_errors
            .lock()
            .expect("attach errors lock")
            .insert(pid, why);
    }

    /// Forgets the engine's attach error: it is attached now.
    pub fn attach_succeeded(&self, pid: u32) {
        self.attach_errors
            .lock()
            .expect("attach errors lock")
            .remove(&pid);
    }

    /// Forgets the attach errors of processes that are no longer candidates.
    pub fn keep_attach_errors_of(&self, candidates: &BTreeSet<u32>) {
        self.attach_errors
            .lock()
            .expect("attach errors lock")
            .retain(|p, _| candidates.contains(p));
    }

    /// The attached engines' statuses, by pid.
    pub fn statuses(&self) -> Vec<EngineStatus> {
        self.statuses
            .lock()
            .expect("status lock")
            .values()
            .cloned()
            .collect()
    }

    /// The attached engines' pids.
    pub fn pids(&self) -> Vec<u32> {
        self.statuses
            .lock()
            .expect("status lock")
            .keys()
            .copied()
            .collect()
    }

    /// The engines that could not be attached, with why.
    pub fn attach_errors(&self) -> BTreeMap<u32, String> {
        self.attach_errors
            .lock()
            .expect("attach errors lock")
            .clone()
    }
}
