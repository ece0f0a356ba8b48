//! Attaching engines. Each attach runs on a thread of its own: it waits for the engine's main
//! thread to reach a safe point (seconds for an engine that sits in a C call), and the loop
//! keeps serving the other engines meanwhile. The thread runs at the background CPU
//! reservation where the kernel grants it ([`crate::os::sched::reserved_or_normal`]): its tens
//! of milliseconds of CPU neither wait behind an engine that saturates the CPUs (at the normal
//! policy a test's attaches there took 10 s to minutes) nor crowd it out. An attach that fails is published with why
//! and tried again after [`ATTACH_RETRY`]; one still running after [`ATTACH_SLOW`] is logged
//! and published with what its thread and its helper processes are doing.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicI32, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use log::warn;
use pod_identity::Identity;
use sys_util::{
    futex::Bell,
    task_state::{children_doing, cpu_contention, doing},
};

use super::engine::Engine;
use crate::{api::board::EngineBoard, config::SentinelConfig};

/// Wait before retrying an engine that could not be attached.
pub const ATTACH_RETRY: Duration = Duration::from_secs(10);

/// How long an attach runs before it is reported as slow. Attaches take seconds (the wait
/// for a safe point, the probe's import); each of their steps has a limit of its own, so an
/// attach past this is stuck somewhere unexpected.
pub const ATTACH_SLOW: Duration = Duration::from_secs(30);

/// An attach in progress.
struct Attaching {
    thread: JoinHandle<Result<Engine>>,
    since: Instant,
    /// The attach thread's id (0 until it runs), for saying what it is doing.
    tid: Arc<AtomicI32>,
    reported: bool,
}

/// The attaches in progress and the engines waiting for their retry.
pub struct Attacher {
    sentinel: SentinelConfig,
    state_dir: PathBuf,
    attaching: BTreeMap<u32, Attaching>,
    retry_at: BTreeMap<u32, Instant>,
    /// Rung when an attach finishes, so that the loop takes the engine at once.
    bell: Arc<Bell>,
}

impl Attacher {
    /// Attaches engines with `sentinel`'s settings, their models kept under `state_dir`.
    pub fn new(sentinel: &SentinelConfig, state_dir: &Path) -> Self {
        Self {
            sentinel: sentinel.clone(),
            state_dir: state_dir.to_path_buf(),
            attaching: BTreeMap::new(),
            retry_at: BTreeMap::new(),
            bell: Arc::default(),
        }
    }

    /// Rung whenever an attach finishes: for the loop's wait, seen before
    /// [`Attacher::finished`].
    pub fn bell(&self) -> &Bell {
        &self.bell
    }

    /// Whether an attach of `pid` may start now: none is running and no retry is pending.
    pub fn may_start(&self, pid: u32) -> bool {
        !self.attaching.contains_key(&pid)
            && self.retry_at.get(&pid).is_none_or(|t| Instant::now() >= *t)
    }

    /// Starts attaching `pid`, placed by `identity`, on its own thread.
    pub fn start(&mut self, pid: u32, identity: Identity, board: &EngineBoard) {
        let (sentinel, state_dir) = (self.sentinel.clone(), self.state_dir.clone());
        let bell = self.bell.clone();
        let tid = Arc::new(AtomicI32::new(0));
        let tid_set = tid.clone();
        match std::thread::Builder::new()
            .name("stallscope-attach".into())
            .spawn(move || {
                // SAFETY: gettid has no preconditions.
                tid_set.store(unsafe { libc::gettid() }, Ordering::Relaxed);
                crate::os::sched::reserved_or_normal();
                let attached = Engine::attach(pid, identity, &sentinel, &state_dir);
                bell.ring();
                attached
            }) {
            Ok(thread) => {
                let a = Attaching {
                    thread,
                    since: Instant::now(),
                    tid,
                    reported: false,
                };
                self.attaching.insert(pid, a);
            }
            Err(e) => self.failed(pid, e.into(), board),
        }
    }

    /// The engines whose attach finished and succeeded; failures are published and retried.
    /// Attaches running past [`ATTACH_SLOW`] are reported here, once each.
    pub fn finished(&mut self, board: &EngineBoard) -> Vec<(u32, Engine)> {
        self.report_slow(board);
        let done: Vec<u32> = self
            .attaching
            .iter()
            .filter(|(_, a)| a.thread.is_finished())
            .map(|(pid, _)| *pid)
            .collect();
        let mut attached = Vec::new();
        for pid in done {
            let outcome = match self.attaching.remove(&pid).map(|a| a.thread.join()) {
                Some(Ok(r)) => r,
                Some(Err(_)) => Err(anyhow::anyhow!(
                    "attaching engine pid {pid}: the thread panicked"
                )),
                None => continue,
            };
            match outcome {
                Ok(e) => {
                    self.retry_at.remove(&pid);
                    board.attach_succeeded(pid);
                    attached.push((pid, e));
                }
                Err(e) => self.failed(pid, e, board),
            }
        }
        attached
    }

    /// Forgets the retries and attach errors of processes that are no longer candidates.
    pub fn keep_only(&mut self, candidates: &BTreeSet<u32>, board: &EngineBoard) {
        self.retry_at.retain(|p, _| candidates.contains(p));
        board.keep_attach_errors_of(candidates);
    }

    /// Waits for the attaches in progress; the engines they attached (to be detached).
    pub fn join_all(&mut self) -> Vec<(u32, Engine)> {
        std::mem::take(&mut self.attaching)
            .into_iter()
            .filter_map(|(pid, a)| Some((pid, a.thread.join().ok()?.ok()?)))
            .collect()
    }

    /// Logs and publishes each attach running past [`ATTACH_SLOW`] with what its thread and
    /// the helper processes it started are doing; the attach goes on.
    fn report_slow(&mut self, board: &EngineBoard) {
        for (pid, a) in &mut self.attaching {
            if a.reported || a.thread.is_finished() || a.since.elapsed() < ATTACH_SLOW {
                continue;
            }
            a.reported = true;
            let task = format!("/proc/self/task/{}", a.tid.load(Ordering::Relaxed));
            let why = format!(
                "attaching engine pid {pid} has taken {} s and goes on: its thread is in {}{}{}",
                a.since.elapsed().as_secs(),
                doing(&task),
                children_doing(&task),
                cpu_contention()
            );
            warn!("{why}");
            board.attach_failed(*pid, why);
        }
    }

    fn failed(&mut self, pid: u32, e: anyhow::Error, board: &EngineBoard) {
        warn!("{e:#} (retrying in {ATTACH_RETRY:?})");
        board.attach_failed(pid, format!("{e:#}"));
        self.retry_at.insert(pid, Instant::now() + ATTACH_RETRY);
    }
}
