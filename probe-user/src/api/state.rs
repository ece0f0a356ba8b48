//! The owners the daemon's loop writes and the HTTP API reads, gathered for the handlers:
//! each guards its own state.

use std::{path::Path, sync::Arc};

use anyhow::Result;

use super::{alerts::AlertLog, board::EngineBoard, metrics::Metrics};
use crate::deep_dive::book::Book;

/// Shared between the daemon's loop and the HTTP server.
pub struct Shared {
    /// Prometheus metrics.
    pub metrics: Metrics,
    /// Per-engine status and attach errors.
    pub engines: EngineBoard,
    /// The deep dives' records, the capture running now and the normal references.
    pub deep_dive: Arc<Book>,
    /// Alerts: the recent ones and the alert log.
    pub alerts: AlertLog,
}

impl Shared {
    /// Opens (appends to) the alert log.
    pub fn new(alerts_log: &Path) -> Result<Self> {
        let metrics = Metrics::new();
        let alerts = AlertLog::open(
            alerts_log,
            metrics
                .state_write_failures
                .with_label_values(&["alert_log"]),
        )?;
        Ok(Self {
            metrics,
            engines: EngineBoard::default(),
            deep_dive: Arc::default(),
            alerts,
        })
    }
}
