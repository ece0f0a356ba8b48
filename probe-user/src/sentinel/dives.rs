//! The daemon's deep dives: one capture at a time (the kernel plane has one event ring), fed
//! by the engine's own probe calls; started for an alert (within the cooldown and the hourly
//! budget), on request (`POST /api/v1/deep-dive`), or as the rolling normal reference of a
//! healthy engine, in that order of priority; each handed to a writer thread when its window
//! is over.

use std::{
    collections::BTreeMap,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use log::{info, warn};

use super::{
    engine::Engine,
    loop_watchdog::{Marker, Phase},
};
use crate::{
    config::DeepDiveConfig,
    deep_dive::{
        book::Book,
        job::{Job, Purpose},
        registry::Request,
    },
    kernel_plane::KernelPlane,
    os::clock,
};

/// A deep dive set for an instant (a serving group's) starts its capture this long before
/// it, so that its window opens at the instant with every source running: starting them
/// (the kernel's events, the stack sampler, the GPU agent) takes milliseconds to tens of
/// milliseconds, more on a node whose CPUs the engine saturates.
const LEAD: Duration = Duration::from_millis(250);

/// The engines the daemon serves, by pid.
pub type Engines = BTreeMap<u32, Engine>;

/// The deep-dive scheduler.
pub struct Dives<'a> {
    cfg: &'a DeepDiveConfig,
    /// Where traces and reports are written.
    dir: PathBuf,
    book: Arc<Book>,
    /// The capture in progress.
    job: Option<Job>,
    /// Writer threads of finished captures.
    writers: Vec<std::thread::JoinHandle<()>>,
    /// When each engine's last normal reference was started.
    reference_at: BTreeMap<u32, Instant>,
    /// When the last alert-triggered deep dive started (for the cooldown).
    alert_dive_at: Option<Instant>,
}

impl<'a> Dives<'a> {
    pub fn new(cfg: &'a DeepDiveConfig, dir: PathBuf, book: Arc<Book>) -> Dives<'a> {
        Dives {
            cfg,
            dir,
            book,
            job: None,
            writers: Vec::new(),
            reference_at: BTreeMap::new(),
            alert_dive_at: None,
        }
    }

    /// Runs the deep-dive machinery once per loop: feeds and finishes the capture in
    /// progress, then starts the next one (an alert's, a requested one, or a due normal
    /// reference), in that order of priority.
    pub fn tick(&mut self, engines: &mut Engines, plane: &mut KernelPlane, mark: &Marker) {
        let dd = self.cfg;
        if let Some(job) = &mut self.job {
            if !job.ending() {
                if let Some(e) = engines.get_mut(&job.pid) {
                    job.feed(e.drain_tap());
                    job.feed_gpu(e.drain_gpu_tap());
                }
            }
            let was_ending = job.ending();
            let stopped = job.poll(plane);
            let (pid, ended) = (job.pid, job.ending() && !was_ending);
            if ended {
                self.end_capture(engines, mark, pid);
            }
            if stopped {
                let job = self.job.take().expect("checked");
                self.finish(job, engines, plane, mark);
            }
        }
        let alerts: Vec<(u32, u64)> = engines
            .iter_mut()
            .filter_map(|(&pid, e)| e.take_new_alert().map(|a| (pid, a)))
            .collect();
        for (pid, alert) in alerts {
            // A normal reference recording of this engine is not normal any more: drop it,
            // whether or not the alert gets a deep dive of its own.
            self.abandon_reference(engines, plane, mark, Some(pid));
            if !dd.on_alert {
                continue;
            }
            if let Some(t) = self.alert_dive_at.filter(|t| t.elapsed() < dd.cooldown) {
                info!(
                    "engine {pid}: no deep dive for alert {alert}: the last one started {:.0?} ago ([deep_dive] cooldown {:?})",
                    t.elapsed(),
                    dd.cooldown
                );
                continue;
            }
            // An alert outranks a reference recording of another engine too.
            self.abandon_reference(engines, plane, mark, None);
            // A capture still stopping holds the kernel's event ring: the deep dive waits in
            // the queue for it.
            let queue = self.job.is_some();
            let admitted = self.book.registry.lock().expect("registry").admit(
                pid,
                format!("alert {alert}"),
                dd.duration,
                Duration::ZERO,
                dd.max_per_hour,
                queue,
            );
            match admitted {
                Ok(id) if queue => {
                    self.alert_dive_at = Some(Instant::now());
                    info!("engine {pid}: deep dive {id} for alert {alert} starts once the previous capture has stopped");
                }
                Ok(id) => {
                    self.alert_dive_at = Some(Instant::now());
                    let req = Request {
                        id,
                        pid,
                        duration: dd.duration,
                        baseline: Duration::ZERO,
                        start_at_unix_ns: None,
                    };
                    self.start(Purpose::DeepDive(req), pid, engines, plane, mark);
                }
                Err(why) => info!("engine {pid}: no deep dive for alert {alert}: {why}"),
            }
        }
        if self.job.is_none() {
            let next = self
                .book
                .registry
                .lock()
                .expect("registry")
                .next_request(clock::unix_ns(), LEAD);
            if let Some(req) = next {
                let pid = req.pid;
                self.start(Purpose::DeepDive(req), pid, engines, plane, mark);
            }
        }
        if self.job.is_none() {
            let due = engines.iter().find(|(pid, e)| {
                e.healthy()
                    && e.healthy_for() >= dd.reference_settle
                    && self
                        .reference_at
                        .get(pid)
                        .is_none_or(|t| t.elapsed() >= dd.reference_every)
            });
            if let Some((&pid, _)) = due {
                self.reference_at.insert(pid, Instant::now());
                self.start(Purpose::Reference, pid, engines, plane, mark);
            }
        }
    }

    /// How long until the scheduler has something due at a set time: the capture in
    /// progress ends its window, or the next queued request may start (zero: now). None when
    /// nothing is, or when a stopping capture holds the queue back (it is polled).
    pub fn next_due_in(&self) -> Option<Duration> {
        match &self.job {
            Some(job) if job.ending() => None,
            Some(job) => Some(job.ends_in()),
            None => {
                let due = self
                    .book
                    .registry
                    .lock()
                    .expect("registry")
                    .next_due_unix_ns(LEAD)?;
                Some(Duration::from_nanos(due.saturating_sub(clock::unix_ns())))
            }
        }
    }

    /// Starts a capture of engine `pid`, fed by its probe calls.
    fn start(
        &mut self,
        purpose: Purpose,
        pid: u32,
        engines: &mut Engines,
        plane: &mut KernelPlane,
        mark: &Marker,
    ) {
        mark.enter(Phase::CaptureStart);
        let id = match &purpose {
            Purpose::DeepDive(r) => Some(r.id),
            Purpose::Reference => None,
        };
        let Some(engine) = engines.get_mut(&pid) else {
            if let Some(id) = id {
                let why = format!("engine {pid} is no longer attached");
                self.book.registry.lock().expect("registry").fail(id, why);
            }
            return;
        };
        let source = engine.start_tap();
        let gpu_fed = self.cfg.has("gpu") && engine.start_gpu_tap();
        let identity = engine.identity().clone();
        match Job::start(purpose, pid, identity, source, gpu_fed, self.cfg, plane) {
            Ok(job) => {
                let what = match id {
                    Some(id) => format!("deep dive {id} of engine {pid}"),
                    None => format!("normal reference of engine {pid}"),
                };
                info!("started the capture: {what}");
                *self.book.capture.lock().expect("capture lock") = Some(what);
                self.job = Some(job);
            }
            Err(e) => {
                warn!("engine {pid}: cannot start a capture: {e:#}");
                stop_tap(engines, pid);
                if let Some(id) = id {
                    self.book
                        .registry
                        .lock()
                        .expect("registry")
                        .fail(id, format!("{e:#}"));
                }
            }
        }
    }

    /// Hands a finished capture to a writer thread.
    fn finish(&mut self, job: Job, engines: &mut Engines, plane: &mut KernelPlane, mark: &Marker) {
        self.end_capture(engines, mark, job.pid);
        self.writers.retain(|w| !w.is_finished());
        if let Some(w) = job.finish(
            plane,
            self.book.clone(),
            self.dir.clone(),
            self.cfg.max_bytes,
        ) {
            self.writers.push(w);
        }
    }

    /// Abandons the normal-reference recording in progress (of engine `pid`, or of any): it
    /// stops in the background and is dropped once stopped. One whose window is already
    /// over is kept.
    fn abandon_reference(
        &mut self,
        engines: &mut Engines,
        plane: &mut KernelPlane,
        mark: &Marker,
        pid: Option<u32>,
    ) {
        let Some(job) = self.job.as_mut().filter(|j| {
            matches!(j.purpose, Purpose::Reference) && !j.ending() && pid.is_none_or(|p| j.pid == p)
        }) else {
            return;
        };
        let job_pid = job.pid;
        job.abandon(plane);
        self.end_capture(engines, mark, job_pid);
        self.reference_at.remove(&job_pid);
    }

    /// What stopping a capture of engine `pid` takes on the daemon's side, finished or
    /// abandoned: the watchdog's phase, the status, the engine's tap.
    fn end_capture(&mut self, engines: &mut Engines, mark: &Marker, pid: u32) {
        mark.enter(Phase::CaptureFinish);
        *self.book.capture.lock().expect("capture lock") = None;
        stop_tap(engines, pid);
    }

    /// At the daemon's exit: the capture in progress is written with what it has, and every
    /// writer is waited for (so no trace is cut short).
    pub fn stop(mut self, engines: &mut Engines, plane: &mut KernelPlane, mark: &Marker) {
        if let Some(mut job) = self.job.take() {
            job.note("the daemon stopped: the capture covers the part before".into());
            self.finish(job, engines, plane, mark);
        }
        for w in std::mem::take(&mut self.writers) {
            let _ = w.join();
        }
    }
}

fn stop_tap(engines: &mut Engines, pid: u32) {
    if let Some(e) = engines.get_mut(&pid) {
        e.stop_tap();
    }
}
