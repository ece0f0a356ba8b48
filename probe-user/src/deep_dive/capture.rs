//! One deep-dive capture: raw kernel events of the target and its child processes, the
//! Python plane with the profile's deep-dive functions, py-spy stack samples, host
//! telemetry, and the GPU plane in every process of the tree that has CUPTI loaded, bounded
//! by an event budget. Everything carries CLOCK_MONOTONIC stamps.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use pod_identity::Identity;
use probe_common::Event;
use pyframe_tracer::{sampling::ThreadStack, Call};

use crate::kernel_plane::drain::Drainer;
use crate::{
    deep_dive::{
        stacks::{self, Samples},
        telemetry::{self, Telemetry},
        tree::{self, Names},
    },
    gpu_plane::{self, GpuEvent, GpuPlane},
    kernel_plane::KernelPlane,
    os::clock,
    os::procfs,
    os::worker::Worker,
    python_plane::{Capture as PythonCapture, PythonReport, PythonRequest},
};

/// What to capture.
#[derive(Debug, Clone)]
pub struct Options {
    /// The engine process (its child processes are captured too).
    pub pid: u32,
    /// Where Python calls come from.
    pub python: PythonSource,
    /// py-spy stack samples per second (0: none).
    pub sample_hz: f64,
    /// Telemetry samples per second (0: none).
    pub telemetry_hz: f64,
    /// Capture raw kernel events (sched, syscalls).
    pub kernel_events: bool,
    /// Kernel events kept at most; the rest are counted as dropped.
    pub max_events: usize,
    /// Attach the GPU plane to the processes that have CUPTI loaded.
    pub gpu: bool,
    /// The engine's pod and container.
    pub identity: Identity,
}

/// Where a capture's Python calls come from.
#[derive(Debug, Clone)]
pub enum PythonSource {
    /// Attach the Python plane for the capture (deep-dive functions on), detach after.
    Attach(PythonRequest),
    /// The caller already has the probes attached (the daemon's engine) and hands the calls
    /// over with [`Running::feed`]; this describes that attachment.
    Fed {
        /// The applied profile.
        framework: Option<String>,
        /// The target's CPython version.
        python: String,
        /// The watched functions (the anchor among them).
        probes: Vec<pyframe_tracer::session::ProbeInfo>,
        /// What writes their records (`native` or `python`).
        writer: String,
    },
}

/// A thread seen during the capture.
#[derive(Debug, Clone)]
pub struct ThreadInfo {
    /// Its process.
    pub pid: u32,
    /// Its name.
    pub comm: String,
    /// Its id in its PID namespace, where that is not the host's.
    pub ns_tid: Option<u32>,
}

/// What a capture collected.
#[derive(Debug, Default)]
pub struct Collected {
    /// The engine process.
    pub pid: u32,
    /// Its pod and container.
    pub identity: Identity,
    /// When the capture was asked for (ns, CLOCK_MONOTONIC).
    pub trigger_ns: u64,
    /// Window start and end.
    pub start_ns: u64,
    /// Window end.
    pub end_ns: u64,
    /// Raw kernel events, in arrival order (per CPU in time order).
    pub kernel: Vec<Event>,
    /// Kernel events dropped by the event budget.
    pub kernel_over_budget: u64,
    /// Kernel events the kernel dropped (ring full).
    pub kernel_lost: u64,
    /// The Python plane's calls and probes (None when it could not attach).
    pub python: Option<PythonReport>,
    /// py-spy samples: (ns, stacks).
    pub stacks: Vec<(u64, Vec<ThreadStack>)>,
    /// Samples that failed.
    pub stack_errors: u64,
    /// Host telemetry.
    pub telemetry: Telemetry,
    /// GPU activity per process (CLOCK_MONOTONIC).
    pub gpu: BTreeMap<u32, Vec<GpuEvent>>,
    /// Processes captured: pid → name (with its pod, container and in-container pid, where
    /// it has them).
    pub processes: BTreeMap<u32, String>,
    /// Threads of those processes: tid → info.
    pub threads: BTreeMap<u32, ThreadInfo>,
    /// Remarks (planes off, sources missing).
    pub notes: Vec<String>,
}

impl Collected {
    /// Until when the kernel events are complete: the window's end, or, when the event budget
    /// ran out, the last event kept (everything after it was dropped). Cycles past it would
    /// look as if the engine's threads had no states or syscalls at all, so the ranking stops
    /// there.
    pub fn kernel_complete_until(&self) -> u64 {
        if self.kernel_over_budget == 0 {
            return self.end_ns;
        }
        self.kernel
            .iter()
            .map(|e| e.ts_ns)
            .max()
            .unwrap_or(self.start_ns)
            .clamp(self.start_ns, self.end_ns)
    }

    /// The earliest captured datum after the trigger (kernel event, telemetry sample or
    /// Python call), ns.
    pub fn first_event_ns(&self) -> Option<u64> {
        let kernel = self.kernel.iter().map(|e| e.ts_ns).min();
        let telemetry = self
            .telemetry
            .series
            .values()
            .filter_map(|s| s.points.first().map(|p| p.0))
            .min();
        let python = self
            .python
            .as_ref()
            .and_then(|p| p.calls.iter().map(|c| c.end_ns).min());
        [kernel, telemetry, python]
            .into_iter()
            .flatten()
            .filter(|&t| t >= self.trigger_ns)
            .min()
    }
}

struct KernelStore {
    events: Vec<Event>,
    over_budget: u64,
    max: usize,
}

/// Calls handed over by the caller ([`PythonSource::Fed`]).
struct FedCalls {
    calls: Vec<Call>,
    framework: Option<String>,
    python: String,
    probes: Vec<pyframe_tracer::session::ProbeInfo>,
    writer: String,
}

/// A capture in progress.
pub struct Running {
    opts: Options,
    /// Processes this capture added to the kernel plane's watch list (unwatched at the end).
    added: Vec<u32>,
    /// Names the tree's processes and threads.
    tree: Worker<Names>,
    fed: Option<FedCalls>,
    trigger_ns: u64,
    start_ns: u64,
    lost_at_start: u64,
    store: Arc<Mutex<KernelStore>>,
    drainer: Option<Drainer>,
    python: Option<PythonCapture>,
    stacks: Option<Worker<Samples>>,
    telemetry: Option<Worker<Telemetry>>,
    gpu: Vec<GpuPlane>,
    gpu_events: BTreeMap<u32, Vec<GpuEvent>>,
    notes: Vec<String>,
    /// Set by [`Running::begin_stop`]: when the capture ended, and the kernel events lost in it.
    ended: Option<(u64, u64)>,
}

impl Running {
    /// Starts capturing. `plane` must be loaded; its deep-dive ring must not be taken yet.
    pub fn start(opts: Options, plane: &mut KernelPlane) -> Result<Running> {
        let trigger_ns = clock::monotonic_ns();
        let pid = opts.pid;
        let mut notes = Vec::new();
        let telemetry = (opts.telemetry_hz > 0.0)
            .then(|| telemetry::start_sampler(Duration::from_secs_f64(1.0 / opts.telemetry_hz)));
        let mut added = Vec::new();
        for p in procfs::process_tree(pid) {
            if !plane.is_watched(p) {
                plane
                    .watch(p)
                    .with_context(|| format!("watching process {p} in the kernel plane"))?;
                added.push(p);
            }
        }
        let store = Arc::new(Mutex::new(KernelStore {
            events: Vec::with_capacity(opts.max_events.min(1 << 20)),
            over_budget: 0,
            max: opts.max_events,
        }));
        let drainer = if opts.kernel_events {
            let sink = store.clone();
            let ring = plane
                .take_ring()
                .context("the kernel plane's event ring is already in use by another deep dive")?;
            let drainer = Drainer::start(ring, move |e| {
                let mut s = sink.lock().expect("kernel store lock");
                if s.events.len() < s.max {
                    s.events.push(*e);
                } else {
                    s.over_budget += 1;
                }
            });
            plane.set_deep_dive(true)?;
            Some(drainer)
        } else {
            None
        };
        let lost_at_start = plane.lost_events();
        let (python, fed) = match &opts.python {
            PythonSource::Attach(req) => match PythonCapture::start(pid as i32, req)? {
                Ok(c) => (Some(c), None),
                Err(why) => {
                    notes.extend(why.map(|w| format!("python plane off: {w}")));
                    (None, None)
                }
            },
            PythonSource::Fed {
                framework,
                python,
                probes,
                writer,
            } => (
                None,
                Some(FedCalls {
                    calls: Vec::new(),
                    framework: framework.clone(),
                    python: python.clone(),
                    probes: probes.clone(),
                    writer: writer.clone(),
                }),
            ),
        };
        let stacks = (opts.sample_hz > 0.0)
            .then(|| match stacks::start(pid, opts.sample_hz) {
                Ok(w) => Some(w),
                Err(e) => {
                    notes.push(format!(
                        "no stack samples: cannot start the sampler's thread: {e}"
                    ));
                    None
                }
            })
            .flatten();
        let tree = tree::start(pid, opts.identity.clone())
            .context("starting the thread that names the capture's processes and threads")?;
        let gpu = if opts.gpu {
            attach_gpu(pid, &mut notes)
        } else {
            Vec::new()
        };
        Ok(Running {
            opts,
            trigger_ns,
            start_ns: clock::monotonic_ns(),
            added,
            tree,
            fed,
            lost_at_start,
            store,
            drainer,
            python,
            stacks,
            telemetry,
            gpu,
            gpu_events: BTreeMap::new(),
            notes,
            ended: None,
        })
    }

    /// Takes Python calls of the target ([`PythonSource::Fed`] captures; ignored otherwise,
    /// and once the window has ended).
    pub fn feed(&mut self, calls: impl IntoIterator<Item = Call>) {
        if self.ended.is_some() {
            return;
        }
        if let Some(f) = self.fed.as_mut() {
            f.calls.extend(calls);
        }
    }

    /// Takes GPU events of the engine's processes from an agent the caller holds (the
    /// daemon's sentinel), for captures that do not attach their own (ignored once the
    /// window has ended).
    pub fn feed_gpu(&mut self, events: BTreeMap<u32, Vec<GpuEvent>>) {
        if self.ended.is_some() {
            return;
        }
        for (pid, e) in events {
            self.gpu_events.entry(pid).or_default().extend(e);
        }
    }

    /// Moves Python records and GPU events out of their rings; call every few tens of ms.
    pub fn poll(&mut self) {
        if let Some(p) = self.python.as_mut() {
            p.poll();
        }
        for g in &mut self.gpu {
            g.poll(self.gpu_events.entry(g.pid()).or_default());
        }
    }

    /// Adds a remark to the capture's notes.
    pub fn note(&mut self, note: String) {
        self.notes.push(note);
    }

    /// Kernel events kept so far.
    pub fn kernel_events(&self) -> usize {
        self.store.lock().expect("kernel store lock").events.len()
    }

    /// Ends the capture window without waiting: the kernel stops sending events, and the
    /// threads of the capture are asked to stop (the ring's drainer first takes what the
    /// kernel had sent; on a busy host that can take seconds). Called again, it does nothing.
    pub fn begin_stop(&mut self, plane: &mut KernelPlane) -> Result<()> {
        if self.ended.is_some() {
            return Ok(());
        }
        self.poll();
        let end_ns = clock::monotonic_ns();
        let kernel_lost = plane.lost_events().saturating_sub(self.lost_at_start);
        self.ended = Some((end_ns, kernel_lost));
        if let Some(d) = &self.drainer {
            plane.set_deep_dive(false)?;
            d.request_stop();
        }
        if let Some(s) = &self.stacks {
            s.request_stop();
        }
        if let Some(t) = &self.telemetry {
            t.request_stop();
        }
        self.tree.request_stop();
        Ok(())
    }

    /// Whether every thread of the capture has stopped since [`Running::begin_stop`]:
    /// [`Running::finish`] will not wait then.
    pub fn stopped(&self) -> bool {
        self.ended.is_some()
            && self.drainer.as_ref().is_none_or(Drainer::is_finished)
            && self.stacks.as_ref().is_none_or(Worker::is_finished)
            && self.telemetry.as_ref().is_none_or(Worker::is_finished)
            && self.tree.is_finished()
    }

    /// Stops every source (waiting for their threads), restores the target, and returns what
    /// was captured. The kernel plane gets its ring back and forgets the processes the
    /// capture added.
    pub fn finish(mut self, plane: &mut KernelPlane) -> Result<Collected> {
        self.begin_stop(plane)?;
        let (end_ns, kernel_lost) = self.ended.expect("set by begin_stop");
        if let Some(d) = self.drainer.take() {
            plane.return_ring(d.stop().0);
        }
        for p in std::mem::take(&mut self.added) {
            let _ = plane.unwatch(p);
        }
        let gpu = std::mem::take(&mut self.gpu);
        let problems = gpu_plane::detach_all(gpu, &mut self.gpu_events);
        self.notes.extend(problems);
        let target_gone = !procfs::process_exists(self.opts.pid);
        let python = match (self.python.take(), self.fed.take()) {
            (Some(c), _) => Some(c.finish(target_gone)?),
            (None, Some(f)) => Some(PythonReport {
                calls: f.calls,
                lost_records: 0,
                framework: f.framework,
                python: f.python,
                probes: f.probes,
                writer: f.writer,
                writer_note: None,
                max_pause_us: 0,
                warnings: Vec::new(),
            }),
            (None, None) => None,
        };
        let stacks = match self.stacks.take() {
            Some(s) => s.stop().unwrap_or_default(),
            None => Samples::default(),
        };
        self.notes.extend(stacks.unavailable);
        let names = self.tree.stop().unwrap_or_default();
        let telemetry = self
            .telemetry
            .take()
            .map(|t| t.stop().expect("telemetry thread panicked"))
            .unwrap_or_default();
        self.notes.extend(telemetry.missing.iter().cloned());
        let store = std::mem::replace(
            &mut *self.store.lock().expect("kernel store lock"),
            KernelStore {
                events: Vec::new(),
                over_budget: 0,
                max: 0,
            },
        );
        if store.over_budget > 0 {
            self.notes.push(format!(
                "{} kernel events over the budget of {} were dropped (raise --max-events); the ranking uses the cycles before the first of them",
                store.over_budget, self.opts.max_events
            ));
        }
        if kernel_lost > 0 {
            self.notes.push(format!(
                "the kernel dropped {kernel_lost} events (event ring full)"
            ));
        }
        if target_gone {
            self.notes.push(format!(
                "process {} exited during the capture",
                self.opts.pid
            ));
        }
        Ok(Collected {
            pid: self.opts.pid,
            identity: self.opts.identity.clone(),
            trigger_ns: self.trigger_ns,
            start_ns: self.start_ns,
            end_ns,
            kernel: store.events,
            kernel_over_budget: store.over_budget,
            kernel_lost,
            python,
            stacks: stacks.samples,
            stack_errors: stacks.errors,
            telemetry,
            gpu: std::mem::take(&mut self.gpu_events),
            processes: names.processes,
            threads: names.threads,
            notes: self.notes,
        })
    }
}

/// Attaches the GPU plane to every process of the tree that has libcupti mapped (CUDA
/// processes); what could not be attached becomes a note.
fn attach_gpu(pid: u32, notes: &mut Vec<String>) -> Vec<GpuPlane> {
    match gpu_plane::attach_tree(pid, cupti_sys::sampling::Sampling::ALWAYS) {
        Ok((planes, failed)) => {
            notes.extend(failed.into_iter().map(|f| format!("GPU plane off for {f}")));
            planes
        }
        Err(e) => {
            notes.push(format!("GPU plane off: {e:#}"));
            Vec::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collected(ts: &[u64], over_budget: u64) -> Collected {
        Collected {
            pid: 1,
            identity: Identity::default(),
            trigger_ns: 100,
            start_ns: 100,
            end_ns: 1000,
            kernel: ts
                .iter()
                .map(|&ts_ns| Event {
                    ts_ns,
                    ..Event::default()
                })
                .collect(),
            kernel_over_budget: over_budget,
            kernel_lost: 0,
            python: None,
            stacks: Vec::new(),
            stack_errors: 0,
            telemetry: Telemetry::default(),
            gpu: BTreeMap::new(),
            processes: BTreeMap::new(),
            threads: BTreeMap::new(),
            notes: Vec::new(),
        }
    }

    #[test]
    fn kernel_events_are_complete_until_the_budget_ran_out() {
        // Arrival order is not time order across CPUs: the latest kept event counts.
        assert_eq!(collected(&[150, 300, 200], 0).kernel_complete_until(), 1000);
        assert_eq!(collected(&[150, 300, 200], 5).kernel_complete_until(), 300);
        assert_eq!(collected(&[], 5).kernel_complete_until(), 100);
    }
}
