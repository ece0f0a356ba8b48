//! Uploads each finished deep dive to the shared store from a thread of its own, so that a
//! slow or absent store never holds up the daemon's loop. A serving group's deep dive is
//! filed under the group's instant with this node's [`NodeEntry`], and the group's index is
//! rebuilt; any other goes under the node's name.
//!
//! Deep dives wait in a bounded queue; a failed upload is retried (backing off up to 30 s)
//! until it goes or the daemon stops. A full queue drops its oldest deep dive, counted in
//! `stallscope_store_dropped_total`, as is what still waits at shutdown after one last try.

use std::{
    collections::{BTreeSet, VecDeque},
    sync::{atomic::AtomicBool, Arc, Condvar, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use prometheus::IntCounter;

use super::{
    index::{group_dir, GroupIndex, NodeEntry},
    store::Store,
};
use crate::{
    api::alerts::Alert,
    config::StoreConfig,
    deep_dive::registry::{Phase, Record},
    os::worker::Worker,
};

/// How far before a group's instant an engine's alert counts as its slowdown: an alert that
/// led to the group's deep dive opened at most this long before the instant (Alertmanager's
/// group_wait and the lead).
const LOOKBACK_MS: u64 = 120_000;
/// Rebuilds of the index after an upload, `SETTLE` apart: a node that rebuilt it while
/// another's entry was landing finds the entry on its next round.
const INDEX_ROUNDS: usize = 3;
const SETTLE: Duration = Duration::from_millis(500);

/// One deep dive to upload.
struct Job {
    record: Record,
    pod: Option<String>,
    slowed_unix_ms: Option<u64>,
}

struct Queue {
    jobs: Mutex<VecDeque<Job>>,
    ready: Condvar,
    capacity: usize,
    dropped: IntCounter,
}

/// The upload thread and its queue.
pub struct Uploader {
    queue: Arc<Queue>,
    /// Deep dives already handed over, by id.
    handed: BTreeSet<u64>,
    worker: Option<Worker<()>>,
}

/// The counters the uploader keeps.
pub struct Counters {
    pub uploaded: IntCounter,
    pub dropped: IntCounter,
    pub failures: IntCounter,
}

impl Uploader {
    /// Opens the store `cfg` names and starts the upload thread; `node` names this node.
    pub fn start(cfg: &StoreConfig, node: String, counters: Counters) -> Result<Uploader> {
        let store = Store::open(cfg)?;
        let queue = Arc::new(Queue {
            jobs: Mutex::new(VecDeque::new()),
            ready: Condvar::new(),
            capacity: cfg.queue,
            dropped: counters.dropped.clone(),
        });
        let (q, name) = (queue.clone(), node.clone());
        let worker = Worker::spawn("stallscope-store", move |stop| {
            run(&store, &name, &q, &counters, stop)
        })
        .context("starting the store's upload thread")?;
        log::info!(
            "uploading deep dives to {} bucket {:?} under {:?} as node {node:?}",
            cfg.endpoint,
            cfg.bucket,
            cfg.prefix
        );
        Ok(Uploader {
            queue,
            handed: BTreeSet::new(),
            worker: Some(worker),
        })
    }

    /// Hands each deep dive of `records` that finished since the last call to the upload
    /// thread; `alerts` (the daemon's recent ones) date each engine's slowdown, `pod` names
    /// its engine's pod.
    pub fn deep_dives(
        &mut self,
        records: &[Record],
        alerts: &[Alert],
        mut pod: impl FnMut(u32) -> Option<String>,
    ) {
        for r in records {
            if r.state != Phase::Done || !self.handed.insert(r.id) {
                continue;
            }
            let job = Job {
                slowed_unix_ms: slowed_since(r, alerts),
                pod: pod(r.pid),
                record: r.clone(),
            };
            let mut jobs = self.queue.jobs.lock().expect("store queue lock");
            if jobs.len() >= self.queue.capacity {
                if let Some(old) = jobs.pop_front() {
                    self.queue.dropped.inc();
                    log::warn!(
                        "store: deep dive {} is dropped unsent: {} deep dives wait for a slow or absent store ([store] queue)",
                        old.record.id,
                        self.queue.capacity
                    );
                }
            }
            jobs.push_back(job);
            self.queue.ready.notify_one();
        }
    }

    /// Tries what still waits once more, counts what does not go as dropped, and stops.
    pub fn shutdown(&mut self) {
        if let Some(w) = self.worker.take() {
            w.request_stop();
            self.queue.ready.notify_all();
            let _ = w.stop();
        }
    }
}

impl Drop for Uploader {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The start of engine `r.pid`'s earliest alert open between `LOOKBACK_MS` before the group's
/// instant and the end of the deep-dive window, ms since the epoch.
fn slowed_since(r: &Record, alerts: &[Alert]) -> Option<u64> {
    let instant_ms = r.start_at_unix_ns? / 1_000_000;
    let end_ms = r.window_unix_ns.map_or(u64::MAX, |w| w[1] / 1_000_000);
    alerts
        .iter()
        .filter(|a| a.pid == r.pid)
        .filter(|a| a.started_unix_ms <= end_ms)
        .filter(|a| {
            a.ended_unix_ms
                .is_none_or(|e| e + LOOKBACK_MS >= instant_ms)
        })
        .map(|a| a.started_unix_ms)
        .min()
}

/// The upload thread: takes deep dives in order, retrying the first until it goes.
fn run(store: &Store, node: &str, q: &Queue, c: &Counters, stop: &AtomicBool) {
    let stopping = || stop.load(std::sync::atomic::Ordering::Acquire);
    let mut backoff = Duration::from_secs(1);
    loop {
        let job = {
            let mut jobs = q.jobs.lock().expect("store queue lock");
            while jobs.is_empty() && !stopping() {
                jobs = q
                    .ready
                    .wait_timeout(jobs, Duration::from_secs(1))
                    .expect("store queue lock")
                    .0;
            }
            match jobs.pop_front() {
                Some(j) => j,
                None => return,
            }
        };
        match upload(store, node, &job) {
            Ok(at) => {
                c.uploaded.inc();
                backoff = Duration::from_secs(1);
                log::info!("store: deep dive {} uploaded to {at}", job.record.id);
            }
            Err(e) => {
                c.failures.inc();
                if stopping() {
                    c.dropped.inc();
                    log::warn!(
                        "store: deep dive {} is not uploaded (the daemon stops): {e:#}",
                        job.record.id
                    );
                    continue;
                }
                log::warn!(
                    "store: uploading deep dive {} failed, retrying in {backoff:?}: {e:#}",
                    job.record.id
                );
                q.jobs.lock().expect("store queue lock").push_front(job);
                let t = std::time::Instant::now();
                while t.elapsed() < backoff && !stopping() {
                    std::thread::sleep(Duration::from_millis(100));
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Uploads one deep dive; returns where it went.
fn upload(store: &Store, node: &str, job: &Job) -> Result<String> {
    let r = &job.record;
    let read = |path: &Option<String>| -> Result<Vec<u8>> {
        let path = path.as_deref().context("the record names no file")?;
        std::fs::read(path).with_context(|| format!("reading {path}"))
    };
    let (trace, report) = (read(&r.trace)?, read(&r.report)?);
    let (Some(group), Some(instant)) = (&r.group, r.start_at_unix_ns) else {
        let dir = format!("nodes/{node}/{}-{}", r.id, r.requested_unix_ms);
        store.put(&format!("{dir}/trace.pftrace"), trace)?;
        store.put(&format!("{dir}/report.json"), report)?;
        return Ok(store.key(&dir));
    };
    let group_dir = group_dir(group, instant);
    let dir = format!("{group_dir}/{node}");
    let [start, end] = r
        .window_unix_ns
        .context("a finished deep dive without its window")?;
    let entry = NodeEntry {
        node: node.to_string(),
        group: group.clone(),
        instant_unix_ns: instant,
        pid: r.pid,
        pod: job.pod.clone(),
        window_unix_ns: [start, end],
        clock_offset_ns: r.clock_offset_ns.unwrap_or_default(),
        late_ms: (start as i64 - instant as i64) as f64 / 1e6,
        trace: format!("{dir}/trace.pftrace"),
        report: format!("{dir}/report.json"),
        category: r.category.clone(),
        summary: r.summary.clone(),
        suspects: r.suspects.clone(),
        slowed_unix_ms: job.slowed_unix_ms,
    };
    store.put(&entry.trace, trace)?;
    store.put(&entry.report, report)?;
    store.put(
        &format!("{dir}/entry.json"),
        serde_json::to_vec_pretty(&entry)?,
    )?;
    let mut seen = 0;
    for round in 0..INDEX_ROUNDS {
        if round > 0 {
            std::thread::sleep(SETTLE);
        }
        let index = rebuild_index(store, group, instant)?;
        if index.nodes.len() == seen {
            break;
        }
        seen = index.nodes.len();
    }
    Ok(store.key(&dir))
}

/// Rebuilds group `group`'s index at `instant` from the nodes' entries in the store, writes
/// it, and returns it.
pub fn rebuild_index(store: &Store, group: &str, instant: u64) -> Result<GroupIndex> {
    let dir = group_dir(group, instant);
    let mut entries = Vec::new();
    for key in store.list(&format!("{dir}/"))? {
        if key.ends_with("/entry.json") {
            let bytes = store.get(&key)?;
            let e: NodeEntry = serde_json::from_slice(&bytes)
                .with_context(|| format!("{key} is not a node's entry"))?;
            entries.push(e);
        }
    }
    let index = GroupIndex::of(group, instant, entries);
    store.put(
        &format!("{dir}/index.json"),
        serde_json::to_vec_pretty(&index)?,
    )?;
    Ok(index)
}
