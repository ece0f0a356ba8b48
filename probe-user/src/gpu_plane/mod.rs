//! The GPU plane: loads the CUPTI agent (`libstallscope_cupti_agent.so`) into a live Python
//! engine, reads its shared-memory channel, puts GPU time on CLOCK_MONOTONIC, and detaches
//! leaving nothing behind.
//!
//! Attach: the channel file is created in the target's `/dev/shm`, a copy of the agent in its
//! `/tmp`; `ctypes.CDLL` loads it at a Python safe point (the main thread, holding the GIL,
//! never a thread that may hold a lock); the agent reports RUNNING or FAILED with a reason.
//! Both files are unlinked once mapped. Detach: the agent is told to stop, gives CUPTI back
//! (disable, flush, unsubscribe, finalize), its thread ends, and the library is unloaded with
//! `dlclose`. If stallscope dies instead, the agent detaches itself after 30 s of silence.

pub mod clock;
pub mod feed;
pub mod nvml;
pub mod summary;
pub mod trace;
pub mod traced;

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use cupti_sys::channel::{self, control, state, Channel, Event, Names};
use cupti_sys::sampling::Sampling;
use memmap2::MmapMut;

use crate::os::clock::monotonic_ns;

/// Ring slots (64 B each): 16 MiB, about a second of a busy decode loop's records.
const SLOTS: usize = 1 << 18;
/// Longest wait for the agent to start or stop.
const AGENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Longest wait for a Python safe point.
const SAFE_POINT: Duration = Duration::from_secs(10);
/// File name of the agent library next to the stallscope executable.
pub const AGENT_FILE: &str = "libstallscope_cupti_agent.so";

/// Checks for an NVIDIA driver before anything is loaded into a target: without one every
/// CUPTI call fails (CUPTI_ERROR_UNKNOWN), so there is no reason to touch the engine.
/// `STALLSCOPE_GPU_STANDIN=1` stands a stand-in libcupti in for the driver (tests).
pub fn require_driver() -> Result<()> {
    if Path::new("/dev/nvidiactl").exists() || std::env::var_os("STALLSCOPE_GPU_STANDIN").is_some()
    {
        return Ok(());
    }
    bail!("no GPU: no NVIDIA driver on this host (/dev/nvidiactl is missing)")
}

/// The agent library: `STALLSCOPE_GPU_AGENT`, else beside the running executable, its glibc
/// 2.28 build first ([`sys_util::shipped::locate`]).
pub fn agent_library() -> Result<PathBuf> {
    sys_util::shipped::locate("STALLSCOPE_GPU_AGENT", AGENT_FILE)
        .filter(|p| p.is_file())
        .with_context(|| {
            format!(
                "the GPU agent library {AGENT_FILE} is missing: build it with `cargo xtask setup` (it sits next to the stallscope binary) or point STALLSCOPE_GPU_AGENT at it"
            )
        })
}

/// Attaches an agent tracing `sampling` to every process of `pid`'s tree that has libcupti
/// mapped. Returns the planes attached and one line per process that could not be; the error
/// says why none was tried (no driver, no CUDA process, no agent library).
pub fn attach_tree(pid: u32, sampling: Sampling) -> Result<(Vec<GpuPlane>, Vec<String>)> {
    require_driver()?;
    let cuda: Vec<u32> = crate::os::procfs::process_tree(pid)
        .into_iter()
        .filter(|p| sys_util::shipped::is_mapped(*p, "/libcupti.so"))
        .collect();
    if cuda.is_empty() {
        bail!("no process of the engine has CUPTI loaded");
    }
    let agent = agent_library()?;
    let mut planes = Vec::new();
    let mut failed = Vec::new();
    for p in cuda {
        match GpuPlane::attach(p, &agent, sampling) {
            Ok(g) => planes.push(g),
            Err(e) => failed.push(format!("process {p}: {e:#}")),
        }
    }
    Ok((planes, failed))
}

/// Detaches every plane, collecting their last events into `events` by process; one line per
/// plane that lost events or did not detach cleanly.
pub fn detach_all(
    planes: Vec<GpuPlane>,
    events: &mut std::collections::BTreeMap<u32, Vec<GpuEvent>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for g in planes {
        let pid = g.pid();
        let (lost, dropped) = g.losses();
        if lost + dropped > 0 {
            problems.push(format!(
                "GPU plane of process {pid}: {lost} events lost (channel full), {dropped} dropped by CUPTI"
            ));
        }
        match g.detach(events.entry(pid).or_default()) {
            Ok(true) => {}
            Ok(false) => problems.push(format!(
                "the GPU agent stays loaded (idle) in process {pid}"
            )),
            Err(e) => problems.push(format!("GPU plane of process {pid}: {e:#}")),
        }
    }
    problems
}

/// A GPU event with its times on CLOCK_MONOTONIC, and kernel names resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuEvent {
    /// The event (its `start`/`end` already converted).
    pub event: Event,
    /// The kernel's name, for kernels.
    pub name: Option<String>,
}

/// An attached agent.
pub struct GpuPlane {
    pid: u32,
    channel: Channel,
    _map: MmapMut,
    agent_path: String,
    names: Names,
    clock: clock::ClockMap,
    waiting: Vec<Event>,
    detached: bool,
    /// Host tids of the threads CUPTI names by their id in the target's PID namespace.
    host_tids: std::collections::BTreeMap<u32, u32>,
}

fn target_path(pid: u32, inside: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/root{inside}"))
}

/// The host's id of the thread of `pid` that its own PID namespace calls `ns_tid` (0: none).
fn host_tid(pid: u32, ns_tid: u32) -> u32 {
    if ns_tid == 0 || pod_identity::pid_in_namespace(pid) == Some(pid) {
        return ns_tid;
    }
    crate::os::procfs::threads(pid)
        .into_iter()
        .find(|&t| pod_identity::tid_in_namespace(pid, t) == Some(ns_tid))
        .unwrap_or(0)
}

impl GpuPlane {
    /// Loads the agent into `pid`, tracing `sampling`, and waits until it traces (or says why
    /// it cannot).
    pub fn attach(pid: u32, agent: &Path, sampling: Sampling) -> Result<GpuPlane> {
        crate::os::procfs::require_target(pid)?;
        require_driver()?;
        pyframe_tracer::python::find(pid as i32).map_err(|e| {
            anyhow::anyhow!("{e} (the GPU agent is loaded through the Python plane)")
        })?;
        // The agent names its channel by its own pid, which in a container is the pid in the
        // container's PID namespace.
        let own_pid = pod_identity::pid_in_namespace(pid).unwrap_or(pid);
        let shm_inside = format!("/dev/shm/{}", channel::file_name(own_pid));
        let shm = target_path(pid, &shm_inside);
        // The attaching daemon holds the channel's lock until the agent has it mapped and the
        // file is gone: a file whose lock is free was left by a daemon killed mid-attach.
        if sys_util::lock::held(&shm) {
            bail!(
                "process {pid} already has a GPU agent channel ({}) that another stallscope is attaching through: wait for it, or stop it",
                shm.display()
            );
        }
        let file = sys_util::lock::create_locked(&shm)
            .with_context(|| format!("cannot create the GPU channel {}", shm.display()))?;
        let cleanup = |e: anyhow::Error| {
            let _ = std::fs::remove_file(&shm);
            e
        };
        file.set_len(channel::file_len(SLOTS) as u64)
            .map_err(|e| cleanup(e.into()))?;
        // SAFETY: a file we just created, mapped shared; only the agent maps it besides us.
        let mut map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| cleanup(e.into()))?;
        // SAFETY: the mapping is file_len(SLOTS) bytes and lives in the GpuPlane with the channel.
        let channel = unsafe { Channel::init(map.as_mut_ptr(), SLOTS) };
        channel.beat(monotonic_ns());
        // Set before the agent starts: it reads the sampling only between naps of up to a
        // flush period, so one set later would leave its first stretch traced whole.
        channel.set_sampling(sampling);
        let agent_path = format!("/tmp/stallscope-gpu-agent-{pid}.so");
        std::fs::copy(agent, target_path(pid, &agent_path))
            .with_context(|| format!("cannot copy the GPU agent into process {pid}'s /tmp"))
            .map_err(cleanup)?;
        let mut plane = GpuPlane {
            pid,
            channel,
            _map: map,
            agent_path,
            names: Names::default(),
            clock: clock::ClockMap::default(),
            waiting: Vec::new(),
            detached: false,
            host_tids: Default::default(),
        };
        let started = plane.start();
        let _ = std::fs::remove_file(&shm);
        let _ = std::fs::remove_file(target_path(pid, &plane.agent_path));
        match started {
            Ok(()) => Ok(plane),
            Err(e) => {
                plane.unload();
                plane.detached = true;
                Err(e)
            }
        }
    }

    fn start(&mut self) -> Result<()> {
        // A first load starts the agent from its constructor. A library still loaded from an
        // earlier attach is started explicitly; if its agent is still tracing, someone else
        // holds it.
        let source = format!(
            "import ctypes, os, _ctypes\n\
             P = {:?}\n\
             try:\n    h = ctypes.CDLL(P, mode=os.RTLD_NOLOAD | os.RTLD_NOW)\n\
             except OSError:\n    ctypes.CDLL(P)\n\
             else:\n    started = h.stallscope_gpu_agent_start()\n    _ctypes.dlclose(h._handle)\n    \
             if not started:\n        raise RuntimeError('a GPU agent already traces this process (another stallscope?)')\n",
            self.agent_path
        );
        pyframe_tracer::inject::run_source(self.pid as i32, &source, SAFE_POINT)
            .with_context(|| format!("cannot load the GPU agent into process {}", self.pid))?;
        let t = Instant::now();
        loop {
            match self.channel.state() {
                state::RUNNING => return Ok(()),
                state::FAILED | state::DETACHED => bail!(
                    "no GPU plane for process {}: {}",
                    self.pid,
                    self.channel.error()
                ),
                _ if t.elapsed() > AGENT_TIMEOUT => {
                    self.channel.set_control(control::DETACH);
                    bail!(
                        "the GPU agent in process {} did not start within {AGENT_TIMEOUT:?}",
                        self.pid
                    )
                }
                _ => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The target.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Events lost to a full channel, and records CUPTI dropped.
    pub fn losses(&self) -> (u64, u64) {
        (self.channel.lost(), self.channel.cupti_dropped())
    }

    /// The CUPTI version the agent found.
    pub fn cupti_version(&self) -> u32 {
        self.channel.cupti_version()
    }

    /// How the agent holds CUPTI (None before it has subscribed).
    pub fn subscription(&self) -> Option<cupti_sys::subscription::Mode> {
        cupti_sys::subscription::Mode::from_code(self.channel.subscription())
    }

    /// The CUPTI→monotonic mapping so far.
    pub fn clock(&self) -> &clock::ClockMap {
        &self.clock
    }

    /// Asks the agent to trace that share of the time (it follows within 200 ms).
    pub fn set_sampling(&self, s: Sampling) {
        self.channel.set_sampling(s);
    }

    /// Whether the agent still traces (it stops by itself when CUPTI fails).
    pub fn running(&self) -> bool {
        self.channel.state() == state::RUNNING
    }

    /// Beats the heartbeat and moves new events (on CLOCK_MONOTONIC) into `out`.
    pub fn poll(&mut self, out: &mut Vec<GpuEvent>) {
        self.channel.beat(monotonic_ns());
        let mut raw = std::mem::take(&mut self.waiting);
        self.channel.drain(&mut raw);
        for e in raw {
            match e {
                Event::NameChunk { .. } => {
                    self.names.take(&e);
                }
                Event::Clock {
                    cupti_ns,
                    mono_before_ns,
                    mono_after_ns,
                } => self.clock.add(clock::Sample {
                    cupti_ns,
                    mono_before_ns,
                    mono_after_ns,
                }),
                // Already on CLOCK_MONOTONIC.
                Event::Tracing { .. } => out.push(GpuEvent {
                    event: e,
                    name: None,
                }),
                other if !self.clock.ready() => self.waiting.push(other),
                other => {
                    let name = match other {
                        Event::Kernel { name_id, .. } => {
                            self.names.get(name_id).map(str::to_string)
                        }
                        _ => None,
                    };
                    out.push(GpuEvent {
                        event: self.convert(other),
                        name,
                    });
                }
            }
        }
    }

    fn convert(&mut self, mut e: Event) -> Event {
        let c = |t: &mut u64| *t = self.clock.to_monotonic(*t).unwrap_or(*t);
        match &mut e {
            Event::Kernel { start, end, .. } => {
                c(start);
                c(end);
            }
            Event::Memcpy(m) => {
                c(&mut m.start);
                c(&mut m.end);
            }
            Event::Memset(m) => {
                c(&mut m.start);
                c(&mut m.end);
            }
            Event::Api(a) => {
                c(&mut a.start);
                c(&mut a.end);
                let (pid, ns_tid) = (self.pid, a.thread_id);
                let host = *self
                    .host_tids
                    .entry(ns_tid)
                    .or_insert_with(|| host_tid(pid, ns_tid));
                if host != 0 {
                    a.thread_id = host;
                }
            }
            Event::Synchronization(s) => {
                c(&mut s.start);
                c(&mut s.end);
            }
            _ => {}
        }
        e
    }

    /// Stops the agent (CUPTI given back), unloads it, and collects the last events into
    /// `out`. Whether the library is gone from the target's memory.
    pub fn detach(mut self, out: &mut Vec<GpuEvent>) -> Result<bool> {
        self.detached = true;
        self.channel.set_control(control::DETACH);
        let t = Instant::now();
        while self.channel.state() == state::RUNNING && t.elapsed() < AGENT_TIMEOUT {
            std::thread::sleep(Duration::from_millis(20));
        }
        self.poll(out);
        if self.channel.state() == state::RUNNING {
            bail!(
                "the GPU agent in process {} did not stop within {AGENT_TIMEOUT:?}; it stops by itself 30 s after stallscope goes away",
                self.pid
            );
        }
        Ok(self.unload())
    }

    /// Waits for the agent thread to end, then unloads the library; whether it is gone.
    fn unload(&self) -> bool {
        // The agent says its tid as its PID namespace numbers it.
        let tid = host_tid(self.pid, self.channel.agent_tid());
        let t = Instant::now();
        while tid != 0
            && Path::new(&format!("/proc/{}/task/{tid}", self.pid)).exists()
            && t.elapsed() < AGENT_TIMEOUT
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        // One reference from the load, one from the RTLD_NOLOAD lookup.
        let source = format!(
            "import ctypes, os, _ctypes\n_h = ctypes.CDLL({:?}, mode=os.RTLD_NOLOAD | os.RTLD_NOW)._handle\n_ctypes.dlclose(_h)\n_ctypes.dlclose(_h)\n",
            self.agent_path
        );
        if sys_util::shipped::is_mapped(self.pid, &self.agent_path) {
            if let Err(e) = pyframe_tracer::inject::run_source(self.pid as i32, &source, SAFE_POINT)
            {
                log::warn!(
                    "the GPU agent stays loaded in process {} (idle): {e:#}",
                    self.pid
                );
            }
        }
        !sys_util::shipped::is_mapped(self.pid, &self.agent_path)
    }
}

impl Drop for GpuPlane {
    fn drop(&mut self) {
        if !self.detached {
            // Not detached explicitly (an error path): at least stop tracing.
            self.channel.set_control(control::DETACH);
        }
    }
}
