//! Attaching engines. Each attach runs on a thread of its own: it waits for the engine's main
//! thread to reach a safe point (seconds for an engine that sits in a C call), and the loop
//! keeps serving the other engines meanwhile. An attach that fails is published with why
//! and tried again after [`ATTACH_RETRY`].

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
    sync::Arc,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::Result;
use log::warn;
use pod_identity::Identity;
use sys_util::futex::Bell;

use super::engine::Engine;
use crate::{api::board::EngineBoard, config::SentinelConfig};

/// Wait before retrying an engine that could not be attached.
pub const ATTACH_RETRY: Duration = Duration::from_secs(10);

/// The attaches in progress and the engines waiting for their retry.
pub struct Attacher {
    sentinel: SentinelConfig,
    state_dir: PathBuf,
    attaching: BTreeMap<u32, JoinHandle<Result<Engine>>>,
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
        match std::thread::Builder::new()
            .name("stallscope-attach".into())
            .spawn(move || {
                let attached = Engine::attach(pid, identity, &sentinel, &state_dir);
                bell.ring();
                attached
            }) {
            Ok(a) => {
                self.attaching.insert(pid, a);
            }
            Err(e) => self.failed(pid, e.into(), board),
        }
    }

    /// The engines whose attach finished and succeeded; failures are published and retried.
    pub fn finished(&mut self, board: &EngineBoard) -> Vec<(u32, Engine)> {
        let done: Vec<u32> = self
            .attaching
            .iter()
            .filter(|(_, a)| a.is_finished())
            .map(|(pid, _)| *pid)
            .collect();
        let mut attached = Vec::new();
        for pid in done {
            let outcome = match self.attaching.remove(&pid).map(JoinHandle::join) {
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
            .filter_map(|(pid, a)| Some((pid, a.join().ok()?.ok()?)))
            .collect()
    }

    fn failed(&mut self, pid: u32, e: anyhow::Error, board: &EngineBoard) {
        warn!("{e:#} (retrying in {ATTACH_RETRY:?})");
        board.attach_failed(pid, format!("{e:#}"));
        self.retry_at.insert(pid, Instant::now() + ATTACH_RETRY);
    }
}
