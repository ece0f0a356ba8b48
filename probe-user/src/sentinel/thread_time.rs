//! Kernel time of the watched processes' threads: which processes the kernel plane watches,
//! each thread's on-CPU, run-queue and blocked time added to the metrics every report, and
//! the (tid, comm) labels used, so that their series go when the process does.

use std::collections::{BTreeMap, BTreeSet};

use log::{info, warn};

use crate::{
    api::{
        metrics::{ProcessLabels, THREAD_STATES},
        state::Shared,
    },
    kernel_plane::{accounting, KernelPlane, Snapshot},
    os::procfs,
};

/// The watched processes and the thread labels their series use.
#[derive(Default)]
pub struct ThreadTime {
    /// The watched processes and their series' labels.
    watched: BTreeMap<u32, ProcessLabels>,
    /// (tid, comm) label pairs used per pid.
    threads: BTreeMap<u32, BTreeSet<(String, String)>>,
}

impl ThreadTime {
    /// Whether the kernel plane watches `pid`.
    pub fn watches(&self, pid: u32) -> bool {
        self.watched.contains_key(&pid)
    }

    /// The (tid, comm) labels of `pid`'s series.
    pub fn labels(&self, pid: u32) -> Vec<(String, String)> {
        self.threads
            .get(&pid)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Watches the processes in `wanted` (with their series' labels) that are not watched yet,
    /// and lets go of (and removes the series of) those no longer wanted.
    pub fn follow(
        &mut self,
        wanted: &BTreeMap<u32, ProcessLabels>,
        plane: &mut KernelPlane,
        shared: &Shared,
    ) {
        for (&pid, labels) in wanted {
            if self.watched.contains_key(&pid) {
                continue;
            }
            match plane.watch(pid) {
                Ok(()) => {
                    info!(
                        "kernel plane: watching pid {pid} ({})",
                        procfs::cmdline(pid).unwrap_or_default()
                    );
                    self.watched.insert(pid, labels.clone());
                }
                Err(e) => warn!("kernel plane: cannot watch pid {pid}: {e:#}"),
            }
        }
        let gone: Vec<u32> = self
            .watched
            .keys()
            .copied()
            .filter(|p| !wanted.contains_key(p))
            .collect();
        for pid in gone {
            let _ = plane.unwatch(pid);
            let labels = self.watched.remove(&pid).expect("watched");
            let threads: Vec<(String, String)> = self
                .threads
                .remove(&pid)
                .map(|t| t.into_iter().collect())
                .unwrap_or_default();
            shared.metrics.forget_threads(&labels, &threads);
        }
    }

    /// Adds each watched thread's kernel time since `last` to the metrics; the snapshot taken
    /// now.
    pub fn account(
        &mut self,
        plane: &mut KernelPlane,
        last: &Snapshot,
        shared: &Shared,
    ) -> Snapshot {
        let now = plane.snapshot();
        let mut exited = Vec::new();
        for (&pid, labels) in &self.watched {
            for t in accounting::window(pid, last, &now, |tid, s| {
                procfs::thread_comm(pid, tid)
                    .unwrap_or_else(|| accounting::comm_from_bytes(&s.exit_comm))
            }) {
                let tid = t.tid.to_string();
                for (state, ns) in
                    THREAD_STATES
                        .iter()
                        .zip([t.on_cpu_ns, t.runq_wait_ns, t.blocked_ns])
                {
                    shared
                        .metrics
                        .thread_seconds
                        .with_label_values(&labels.with(&[&tid, &t.comm, state]))
                        .inc_by(ns as f64 / 1e9);
                }
                self.threads
                    .entry(pid)
                    .or_default()
                    .insert((tid, t.comm.clone()));
                if t.exited {
                    exited.push(t.tid);
                }
            }
        }
        if now.lost_events > last.lost_events {
            warn!(
                "{} deep-dive events lost since the last report",
                now.lost_events - last.lost_events
            );
        }
        plane.forget_threads(&exited);
        now
    }
}
