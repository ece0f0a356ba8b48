//! What the daemon's deep dives share with the sentinel's loop and the HTTP API: their
//! records, the capture running now, and each engine's latest normal reference.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use sys_util::futex::Bell;

use super::{analysis::Reference, registry::Registry};

/// The deep dives' shared state; each part behind its own lock.
#[derive(Default)]
pub struct Book {
    /// The daemon's deep dives.
    pub registry: Mutex<Registry>,
    /// The capture running now (a deep dive or a normal-reference recording), if any.
    pub capture: Mutex<Option<String>>,
    /// Each engine's latest normal reference, by pid.
    pub references: Mutex<BTreeMap<u32, KeptReference>>,
    /// Rung when a request is queued, so that the capture loop starts it on time.
    pub queued: Bell,
}

/// An engine's latest normal reference, kept for its deep dives' ranking.
#[derive(Debug, Clone)]
pub struct KeptReference {
    /// When it was recorded, unix ms.
    pub recorded_unix_ms: u64,
    /// The reference.
    pub reference: Arc<Reference>,
}

impl KeptReference {
    /// What the status shows of it.
    pub fn status(&self) -> serde_json::Value {
        serde_json::json!({
            "recorded_unix_ms": self.recorded_unix_ms,
            "cycles": self.reference.cycles.len(),
            "mean_cycle_ms": self.reference.mean_cycle_ms,
        })
    }
}
