//! One engine's alerts: the alert open now, its iteration count as it grows, the start and
//! end events (metrics, the alert log, `/api/v1/alerts`), and the id of a new one for the
//! daemon's deep dive.

use log::{info, warn};
use model::{Iteration, Verdict};
use pod_identity::Identity;

use crate::{
    api::{
        alerts::{Alert, Severity},
        metrics::ProcessLabels,
        state::Shared,
    },
    os::clock::unix_ms,
};

/// The alert book of engine `pid`.
pub struct AlertBook {
    pid: u32,
    identity: Identity,
    labels: ProcessLabels,
    open: Option<Alert>,
    /// The open alert's iterations: their durations and predictions summed, µs.
    observed_us: f64,
    predicted_us: f64,
    /// Id of an alert that started since the daemon last looked.
    new: Option<u64>,
}

impl AlertBook {
    pub fn new(pid: u32, identity: Identity, labels: ProcessLabels) -> AlertBook {
        AlertBook {
            pid,
            identity,
            labels,
            open: None,
            observed_us: 0.0,
            predicted_us: 0.0,
            new: None,
        }
    }

    /// Takes in the sentinel's verdict on `it`, decided at `decided_ns` (CLOCK_MONOTONIC).
    pub fn observe(&mut self, it: &Iteration, v: &Verdict, decided_ns: u64, shared: &Shared) {
        let m = &shared.metrics;
        let pid = self.labels.with(&[]);
        if let (Some(predicted), Some(_), Some(a)) = (v.predicted_us, v.error, &mut self.open) {
            a.iterations += 1;
            self.observed_us += it.duration_us();
            self.predicted_us += predicted;
            a.slowdown = self.observed_us / self.predicted_us.max(1.0);
        }
        if v.alert_started {
            let alert = Alert {
                id: shared.alerts.next_id(self.pid),
                pid: self.pid,
                identity: self.identity.clone(),
                started_unix_ms: unix_ms(),
                trigger_iteration_end_ns: it.end_ns,
                detection_latency_us: decided_ns.saturating_sub(it.end_ns) as f64 / 1e3,
                moving_mean: v.moving_mean.unwrap_or_default(),
                window_slowdown: v.window_slowdown.unwrap_or_default(),
                ucl: v.ucl.unwrap_or_default(),
                duration_us: it.duration_us(),
                predicted_us: v.predicted_us.unwrap_or_default(),
                workload: it.workload,
                stage: it.stage.as_str(),
                severity: Severity::of(v.window_slowdown.unwrap_or_default()),
                ended_unix_ms: None,
                iterations: 1,
                slowdown: it.duration_us() / v.predicted_us.unwrap_or_default().max(1.0),
                lasted_ms: None,
            };
            self.observed_us = it.duration_us();
            self.predicted_us = v.predicted_us.unwrap_or_default();
            warn!(
                "engine {}: ALERT decode iterations {:.0}% slower than the baseline predicts (moving mean of E {:.3} over the threshold {:.3})",
                self.pid,
                100.0 * (alert.window_slowdown - 1.0),
                alert.moving_mean,
                alert.ucl
            );
            m.alerts.with_label_values(&pid).inc();
            m.anomaly_active.with_label_values(&pid).set(1);
            shared.alerts.event("alert_start", &alert);
            self.new = Some(alert.id);
            self.open = Some(alert);
        }
        if v.alert_ended {
            if let Some(mut a) = self.open.take() {
                let now = unix_ms();
                a.ended_unix_ms = Some(now);
                a.lasted_ms = Some(now.saturating_sub(a.started_unix_ms));
                info!(
                    "engine {}: alert {} ended after {} iterations, {:.0?} at {:.2} x the predicted time",
                    self.pid,
                    a.id,
                    a.iterations,
                    std::time::Duration::from_millis(a.lasted_ms.unwrap_or_default()),
                    a.slowdown
                );
                shared.alerts.event("alert_end", &a);
            }
            m.anomaly_active.with_label_values(&pid).set(0);
        }
    }

    /// Shows the open alert's record as it is now among the recent alerts.
    pub fn publish(&self, shared: &Shared) {
        if let Some(a) = &self.open {
            shared.alerts.keep(a);
        }
    }

    /// The id of an alert that started since the last call.
    pub fn take_new(&mut self) -> Option<u64> {
        self.new.take()
    }
}
