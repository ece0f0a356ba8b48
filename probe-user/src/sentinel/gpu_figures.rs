//! An engine's GPU plane under the sentinel: the CUPTI feed where the engine has CUDA, each
//! iteration's GPU figures (busy time, void share, launch latency) once its records have
//! settled, and the GPU events a capture taps.

use std::collections::{BTreeMap, VecDeque};

use log::{info, warn};

use crate::{
    api::{metrics::ProcessLabels, state::Shared},
    gpu_plane::{feed::GpuFeed, GpuEvent},
    os::clock::monotonic_ns,
};

/// Iterations the status's mean void share is taken over.
const VOID_WINDOW: usize = 100;

/// The GPU figures of engine `pid`.
pub struct GpuFigures {
    pid: u32,
    labels: ProcessLabels,
    feed: Option<GpuFeed>,
    /// `on: ...` or `off: why`.
    state: String,
    iterations: u64,
    /// Void shares of the latest iterations with GPU figures.
    void: VecDeque<f64>,
}

impl GpuFigures {
    /// Attaches the GPU plane to `pid` when `enabled` (`[sentinel] gpu`) and it has CUDA,
    /// tracing `sampling` of the time (`[sentinel] gpu_sample`).
    pub fn attach(
        pid: u32,
        labels: ProcessLabels,
        enabled: bool,
        sampling: cupti_sys::sampling::Sampling,
    ) -> GpuFigures {
        let (feed, state) = if !enabled {
            (None, "off: [sentinel] gpu = false".to_string())
        } else {
            match GpuFeed::attach(pid, sampling) {
                Ok(g) => {
                    let state = g.describe();
                    info!("engine {pid}: GPU plane {state}");
                    (Some(g), state)
                }
                Err(why) => (None, format!("off: {why}")),
            }
        };
        GpuFigures {
            pid,
            labels,
            feed,
            state,
            iterations: 0,
            void: VecDeque::with_capacity(VOID_WINDOW),
        }
    }

    /// Marks an iteration's span, for the figures of the GPU work inside it.
    pub fn iteration(&mut self, start_ns: u64, end_ns: u64) {
        if let Some(g) = self.feed.as_mut() {
            g.iteration(start_ns, end_ns);
        }
    }

    /// Polls the feed and records the figures of iterations whose records have settled.
    pub fn poll(&mut self, shared: &Shared) {
        let Some(g) = self.feed.as_mut() else {
            return;
        };
        g.poll();
        let m = &shared.metrics;
        let pid = self.labels.with(&[]);
        for f in g.settled(monotonic_ns()) {
            self.iterations += 1;
            m.gpu_busy.with_label_values(&pid).observe(f.busy_us / 1e6);
            m.gpu_void.with_label_values(&pid).observe(f.void_ratio);
            for l in &f.launch_us {
                m.gpu_launch.with_label_values(&pid).observe(l / 1e6);
            }
            if self.void.len() == VOID_WINDOW {
                self.void.pop_front();
            }
            self.void.push_back(f.void_ratio);
        }
    }

    /// `on: <pid> (CUPTI <version>), ...` or `off: <why>`.
    pub fn state(&self) -> &str {
        &self.state
    }

    /// Iterations with GPU figures.
    pub fn iterations(&self) -> u64 {
        self.iterations
    }

    /// Mean void share of the latest iterations with GPU figures.
    pub fn mean_void(&self) -> Option<f64> {
        (!self.void.is_empty()).then(|| self.void.iter().sum::<f64>() / self.void.len() as f64)
    }

    /// Starts keeping GPU events for a capture; false when the engine has no GPU plane.
    pub fn start_tap(&mut self) -> bool {
        self.feed.as_mut().map(GpuFeed::start_tap).is_some()
    }

    /// The GPU events kept since the last call, per process.
    pub fn drain_tap(&mut self) -> BTreeMap<u32, Vec<GpuEvent>> {
        self.feed
            .as_mut()
            .map(GpuFeed::drain_tap)
            .unwrap_or_default()
    }

    /// Stops keeping GPU events.
    pub fn stop_tap(&mut self) {
        if let Some(g) = self.feed.as_mut() {
            g.stop_tap();
        }
    }

    /// Detaches the agent, leaving nothing in the engine.
    pub fn detach(self) {
        if let Some(g) = self.feed {
            for problem in g.detach() {
                warn!("engine {}: GPU plane: {problem}", self.pid);
            }
        }
    }
}
