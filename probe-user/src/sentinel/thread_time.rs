//! Kernel time of the watched processes' threads: which processes the kernel plane watches,
//! each thread's on-CPU, run-queue and blocked time added to the metrics every report, and
//! the (tid, comm) labels used, so that their series go when the process does.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use log::{info, warn};
use probe_common::ThreadStats;
use prometheus::Counter;

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
    /// Each thread's counters, by (pid, tid).
    series: HashMap<(u32, u32), Series>,
    names: Names,
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
            self.series.retain(|&(p, _), _| p != pid);
            self.names.forget_process(pid);
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
        let now = plane.snapshot_threads();
        let mut exited = Vec::new();
        let names = &mut self.names;
        for (&pid, labels) in &self.watched {
            let threads = accounting::window(pid, last, &now, |tid, s| {
                names.name(pid, tid, s, now.taken_ns)
            });
            for t in threads {
                let series = match self.series.get(&(pid, t.tid)) {
                    Some(series) if series.comm == t.comm => series,
                    _ => {
                        let tid = t.tid.to_string();
                        let counters = THREAD_STATES.map(|state| {
                            shared
                                .metrics
                                .thread_seconds
                                .with_label_values(&labels.with(&[&tid, &t.comm, state]))
                        });
                        self.threads
                            .entry(pid)
                            .or_default()
                            .insert((tid, t.comm.clone()));
                        let series = Series {
                            comm: t.comm.clone(),
                            counters,
                        };
                        self.series.insert((pid, t.tid), series);
                        &self.series[&(pid, t.tid)]
                    }
                };
                for (counter, ns) in
                    series
                        .counters
                        .iter()
                        .zip([t.on_cpu_ns, t.runq_wait_ns, t.blocked_ns])
                {
                    if ns > 0 {
                        counter.inc_by(ns as f64 / 1e9);
                    }
                }
                if t.exited {
                    exited.push(t.tid);
                    self.series.remove(&(pid, t.tid));
                    names.forget(pid, t.tid);
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

/// A thread's counters, one per state, for the name they were made with.
struct Series {
    comm: String,
    counters: [Counter; 3],
}

/// How long a thread's name read from `/proc` is used before it is read again: a thread that
/// renames itself after its first report gets its new series within this.
const NAME_TTL_NS: u64 = 60_000_000_000;

/// Thread names, read from `/proc` at most once per [`NAME_TTL_NS`] each: a read takes
/// microseconds, and an engine has dozens of threads.
#[derive(Default)]
struct Names {
    /// (pid, tid) → (name, when it was read).
    read: HashMap<(u32, u32), (String, u64)>,
}

impl Names {
    fn name(&mut self, pid: u32, tid: u32, s: &ThreadStats, now_ns: u64) -> String {
        if s.exited != 0 {
            return accounting::comm_from_bytes(&s.exit_comm);
        }
        if let Some((name, at)) = self.read.get(&(pid, tid)) {
            if now_ns.saturating_sub(*at) < NAME_TTL_NS {
                return name.clone();
            }
        }
        match procfs::thread_comm(pid, tid) {
            Some(name) => {
                self.read.insert((pid, tid), (name.clone(), now_ns));
                name
            }
            None => accounting::comm_from_bytes(&s.exit_comm),
        }
    }

    fn forget(&mut self, pid: u32, tid: u32) {
        self.read.remove(&(pid, tid));
    }

    fn forget_process(&mut self, pid: u32) {
        self.read.retain(|&(p, _), _| p != pid);
    }
}
