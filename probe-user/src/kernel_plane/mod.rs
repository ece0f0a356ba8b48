//! Loader for the kernel plane: loads the eBPF object, attaches every hook (tp_btf, or
//! raw_tracepoint where tp_btf is refused), manages the watched processes, and reads the
//! per-thread accumulators on demand. Dropping it detaches and unloads everything.
//!
//! Every id in and out of this module is the daemon's view of it (its `/proc`'s). When the
//! daemon runs in a PID namespace of its own (a sidecar), the probes learn the kernel's ids
//! of a watched process from its threads as they run, so a thread is accounted from its first
//! switch after the watch began, and one that never runs is not listed.

use std::{
    collections::HashMap as StdHashMap,
    os::fd::{AsFd, OwnedFd},
    time::Duration,
};

use anyhow::{anyhow, Context, Result};
use aya::{
    maps::{Array, HashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::{
        raw_trace_point::RawTracePointLinkId, tp_btf::BtfTracePointLinkId, BtfTracePoint,
        RawTracePoint,
    },
    Btf, Ebpf, EbpfLoader, Endianness,
};
use log::{info, warn};
use probe_common::{
    global, map, prog, state, Config, SyscallKey, SyscallStats, ThreadStats, EVENT_RING_BYTES,
};

pub mod accounting;
pub mod btf_offsets;
pub mod drain;
pub mod features;
pub mod syscall_names;
mod tgid_filter;

use crate::os::{clock, pidns, procfs};
use btf_offsets::TaskOffsets;
use features::Features;
use tgid_filter::TgidFilter;

/// The compiled eBPF object, built by build.rs with the pinned nightly.
static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/probe-ebpf"));

/// Flag for `bpf_map_update_elem`: only create, never overwrite.
const BPF_NOEXIST: u64 = 1;

/// Syscalls left out of the accounting outside deep dives ([`Config::unaccounted`]).
/// `sched_yield` is a spin-wait's: vLLM's engine core yields ~270k times a second while its
/// worker computes, and accounting each one cost the node ~12 % of a core in the probes
/// (BENCHMARKS.md, Kernel plane). The thread's time in it is still running or runnable, and
/// the ranking leaves it out as a wait syscall anyway.
const UNACCOUNTED_SYSCALLS: &[i64] = &[libc::SYS_sched_yield];

/// The bitmap of `nrs` for [`Config::unaccounted`].
fn unaccounted(nrs: &[i64]) -> [u64; probe_common::UNACCOUNTED_WORDS] {
    let mut words = [0u64; probe_common::UNACCOUNTED_WORDS];
    for &nr in nrs {
        let nr = nr as usize;
        if nr < 64 * words.len() {
            words[nr / 64] |= 1 << (nr % 64);
        }
    }
    words
}

/// How a hook was attached.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttachKind {
    /// BTF-enabled tracepoint (preferred, cheaper argument access).
    TpBtf,
    /// Raw tracepoint (fallback).
    RawTracepoint,
}

/// One attached hook.
#[derive(Debug, Clone)]
pub struct Hook {
    /// Tracepoint name, e.g. `sched_switch`.
    pub tracepoint: &'static str,
    /// Name of the program that serves it.
    pub program: &'static str,
    /// Attach type.
    pub kind: AttachKind,
}

/// Run-time statistics of one program (needs [`KernelPlane::enable_run_stats`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct ProgramStats {
    /// Tracepoint name.
    pub tracepoint: String,
    /// Program name ([`probe_common::prog::EMPTY`] for the measuring floor).
    pub program: String,
    /// Times the program ran.
    pub run_count: u64,
    /// Total ns spent in it.
    pub run_time_ns: u64,
}

/// All accumulators at one instant.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// CLOCK_MONOTONIC ns when reading finished.
    pub taken_ns: u64,
    /// Per thread id; `on_cpu_ns`/`runq_wait_ns`/`blocked_ns` include the interval in
    /// progress at read time.
    pub threads: StdHashMap<u32, ThreadStats>,
    /// Per (tid, syscall).
    pub syscalls: StdHashMap<(u32, u32), SyscallStats>,
    /// Deep-dive events lost so far (ring full).
    pub lost_events: u64,
}

/// The loaded kernel plane.
pub struct KernelPlane {
    ebpf: Ebpf,
    watched: HashMap<MapData, u32, u32>,
    watched_view: HashMap<MapData, u32, u32>,
    /// The bits of `watched`'s keys.
    tgids: TgidFilter,
    config_map: Array<MapData, Config>,
    threads: HashMap<MapData, u32, ThreadStats>,
    syscalls: HashMap<MapData, SyscallKey, SyscallStats>,
    lost: PerCpuArray<MapData, u64>,
    /// The deep-dive event ring, mapped only while a capture holds it ([`KernelPlane::take_ring`]).
    events: MapData,
    /// Whether a capture holds the ring.
    ring_out: bool,
    config: Config,
    hooks: Vec<Hook>,
    /// The syscall hooks' links while they are attached.
    syscall_links: Vec<SyscallLink>,
    /// Whether the syscall hooks stay attached outside deep dives.
    syscalls_always: bool,
    run_stats: Option<OwnedFd>,
}

/// An attached syscall hook: its program and link.
enum SyscallLink {
    Btf(&'static str, BtfTracePointLinkId),
    Raw(&'static str, RawTracePointLinkId),
}

impl KernelPlane {
    /// Loads and attaches every program. `features` must satisfy [`Features::require`].
    pub fn load(features: &Features) -> Result<Self> {
        raise_memlock_limit();
        let offsets = TaskOffsets::from_btf(&features.paths.btf)?;
        let btf = Btf::parse_file(&features.paths.btf, Endianness::default())
            .with_context(|| format!("cannot parse kernel BTF {}", features.paths.btf.display()))?;
        let mut ebpf = EbpfLoader::new()
            .btf(Some(&btf))
            .override_global(global::TASK_PID_OFF, &offsets.pid, true)
            .override_global(global::TASK_TGID_OFF, &offsets.tgid, true)
            .load(EBPF_OBJECT)
            .context("loading the eBPF object into the kernel")?;

        let mut take = |name: &str| {
            ebpf.take_map(name)
                .ok_or_else(|| anyhow!("eBPF object has no map {name}"))
        };
        let watched = HashMap::try_from(take(map::WATCHED)?)?;
        let watched_view = HashMap::try_from(take(map::WATCHED_VIEW)?)?;
        let tgids = TgidFilter::new(Array::try_from(take(map::WATCHED_TGIDS)?)?);
        let mut config_map = Array::try_from(take(map::CONFIG)?)?;
        let threads = HashMap::try_from(take(map::THREAD_STATS)?)?;
        let syscalls = HashMap::try_from(take(map::SYSCALL_STATS)?)?;
        let lost = PerCpuArray::try_from(take(map::LOST)?)?;
        let events = match take(map::EVENTS)? {
            Map::RingBuf(m) => m,
            _ => return Err(anyhow!("eBPF map {} is not a ring buffer", map::EVENTS)),
        };

        let view = pidns::own_unless_host().context("reading /proc/self/ns/pid")?;
        if let Some(ns) = view {
            info!(
                "kernel plane: this daemon has a PID namespace of its own (inode {}): the kernel's ids of watched processes are learned as their threads run",
                ns.ino
            );
        }
        let config = Config {
            // The kernel's id of the daemon is unknown in a namespace of its own; it never
            // watches itself either way.
            self_tgid: if view.is_some() {
                0
            } else {
                std::process::id()
            },
            deep_dive: 0,
            wake_threshold: u64::from(EVENT_RING_BYTES / 4),
            view_dev: view.map_or(0, |v| v.dev),
            view_ino: view.map_or(0, |v| v.ino),
            learn: 0,
            regs_nr_off: offsets.regs_nr.unwrap_or(0),
            unaccounted: unaccounted(UNACCOUNTED_SYSCALLS),
            syscalls_since_ns: 0,
            deep_dive_since_ns: 0,
        };
        config_map
            .set(0, config, 0)
            .context("writing the probe configuration")?;

        let (hooks, syscall_links) = attach_all(&mut ebpf, &btf, features)?;
        let kinds: Vec<String> = hooks
            .iter()
            .map(|h| format!("{}:{:?}", h.tracepoint, h.kind))
            .collect();
        info!("kernel plane attached: {}", kinds.join(" "));
        Ok(Self {
            ebpf,
            watched,
            watched_view,
            tgids,
            config_map,
            threads,
            syscalls,
            lost,
            events,
            ring_out: false,
            config,
            hooks,
            syscall_links,
            syscalls_always: true,
            run_stats: None,
        })
    }

    /// Whether the daemon's ids are not the kernel's (see the module's doc).
    fn namespaced(&self) -> bool {
        self.config.view_ino != 0
    }

    /// Starts accounting the threads of `pid`. Existing threads are seeded from /proc so
    /// that time before their first event is credited: runnable ones as "running or
    /// waiting, resolved by the first switch", the others as blocked since now. (In a PID
    /// namespace of the daemon's own, the probes learn them as they run instead.)
    pub fn watch(&mut self, pid: u32) -> Result<()> {
        if pid == std::process::id() {
            return Err(anyhow!("stallscope does not watch itself (pid {pid})"));
        }
        if self.namespaced() {
            self.watched_view
                .insert(pid, 1, 0)
                .with_context(|| format!("watching pid {pid}"))?;
            return self.set_learning(true);
        }
        self.watched
            .insert(pid, pid, 0)
            .with_context(|| format!("watching pid {pid}"))?;
        self.tgids.set(pid, true)?;
        let now = clock::monotonic_ns();
        for tid in procfs::threads(pid) {
            let Some(st) = procfs::thread_state(pid, tid) else {
                continue;
            };
            let seeded = ThreadStats {
                tgid: pid,
                state: if st == 'R' {
                    state::UNKNOWN_RUNNABLE
                } else {
                    state::BLOCKED
                },
                mark_ns: now,
                sys_nr: u32::MAX,
                view_tid: tid,
                view_tgid: pid,
                ..ThreadStats::default()
            };
            // A thread created since WATCHED was filled already has its entry (from
            // sched_wakeup_new): keep it.
            let _ = self.threads.insert(tid, seeded, BPF_NOEXIST);
        }
        Ok(())
    }

    /// Stops accounting `pid` and forgets its threads.
    pub fn unwatch(&mut self, pid: u32) -> Result<()> {
        let _ = self.watched_view.remove(&pid);
        let kernel_ids: Vec<u32> = self
            .watched
            .iter()
            .filter_map(|r| r.ok())
            .filter(|&(_, view)| view == pid)
            .map(|(tgid, _)| tgid)
            .collect();
        for tgid in kernel_ids {
            let _ = self.watched.remove(&tgid);
            self.tgids.set(tgid, false)?;
        }
        // Threads whose id is not learned yet (view_tid 0) go too.
        let tids = self.kernel_tids(|s| s.view_tgid == pid);
        self.forget_kernel_tids(&tids);
        Ok(())
    }

    /// Removes the accumulators of these threads (e.g. exited ones already reported).
    pub fn forget_threads(&mut self, tids: &[u32]) {
        if tids.is_empty() {
            return;
        }
        let tids = self.kernel_tids(|s| s.view_tid != 0 && tids.contains(&s.view_tid));
        self.forget_kernel_tids(&tids);
    }

    /// The kernel's ids of the threads `which` picks.
    fn kernel_tids(&self, which: impl Fn(&ThreadStats) -> bool) -> Vec<u32> {
        self.threads
            .iter()
            .filter_map(|r| r.ok())
            .filter(|(_, s)| which(s))
            .map(|(kernel_tid, _)| kernel_tid)
            .collect()
    }

    /// Removes the accumulators of threads by their kernel ids.
    fn forget_kernel_tids(&mut self, tids: &[u32]) {
        // Finding the syscall keys walks the whole map (two syscalls per key).
        if tids.is_empty() {
            return;
        }
        for tid in tids {
            let _ = self.threads.remove(tid);
        }
        let keys: Vec<SyscallKey> = self
            .syscalls
            .keys()
            .filter_map(|k| k.ok())
            .filter(|k| tids.contains(&k.tid))
            .collect();
        for k in keys {
            let _ = self.syscalls.remove(&k);
        }
    }

    /// Switches the raw event stream on or off (and, after
    /// [`KernelPlane::syscalls_in_deep_dives_only`], the syscall hooks with it).
    pub fn set_deep_dive(&mut self, on: bool) -> Result<()> {
        if on {
            self.config.deep_dive_since_ns = clock::monotonic_ns();
        }
        if self.syscalls_always {
            self.config.deep_dive = u32::from(on);
            return self.write_config("switching deep-dive mode");
        }
        if on {
            self.config.syscalls_since_ns = self.config.deep_dive_since_ns;
            self.config.deep_dive = 1;
            self.write_config("switching deep-dive mode")?;
            self.attach_syscalls()
        } else {
            self.detach_syscalls()?;
            self.config.deep_dive = 0;
            self.write_config("switching deep-dive mode")
        }
    }

    /// Detaches the syscall hooks until a deep dive, and from then on attaches them for deep
    /// dives only. For the daemon: it reads no syscall accumulators (a deep dive streams its
    /// syscalls), while every syscall on the node, of any process, runs the hooks while they
    /// are attached (108-126 ns each for processes nobody watches, BENCHMARKS.md).
    pub fn syscalls_in_deep_dives_only(&mut self) -> Result<()> {
        self.syscalls_always = false;
        if self.config.deep_dive == 0 {
            self.detach_syscalls()?;
        }
        Ok(())
    }

    /// Whether the syscall hooks are attached now.
    fn syscalls_attached(&self) -> bool {
        !self.syscall_links.is_empty()
    }

    fn attach_syscalls(&mut self) -> Result<()> {
        if self.syscalls_attached() {
            return Ok(());
        }
        for h in self.hooks.iter().filter(|h| is_syscall_hook(h.tracepoint)) {
            let program = program(&mut self.ebpf, h.program)?;
            let link = match h.kind {
                AttachKind::TpBtf => {
                    let p: &mut BtfTracePoint = program.try_into()?;
                    SyscallLink::Btf(h.program, p.attach()?)
                }
                AttachKind::RawTracepoint => {
                    let p: &mut RawTracePoint = program.try_into()?;
                    SyscallLink::Raw(h.program, p.attach(h.tracepoint)?)
                }
            };
            self.syscall_links.push(link);
        }
        Ok(())
    }

    fn detach_syscalls(&mut self) -> Result<()> {
        for link in std::mem::take(&mut self.syscall_links) {
            let (name, detached) = match link {
                SyscallLink::Btf(name, id) => {
                    let p: &mut BtfTracePoint = program(&mut self.ebpf, name)?.try_into()?;
                    (name, p.detach(id))
                }
                SyscallLink::Raw(name, id) => {
                    let p: &mut RawTracePoint = program(&mut self.ebpf, name)?.try_into()?;
                    (name, p.detach(id))
                }
            };
            detached.with_context(|| format!("detaching {name}"))?;
        }
        Ok(())
    }

    /// Writes `self.config` to the probes; `what` names the change in an error.
    fn write_config(&mut self, what: &'static str) -> Result<()> {
        self.config_map.set(0, self.config, 0).context(what)?;
        Ok(())
    }

    /// Asks the probes to learn the kernel's ids of watched processes (a namespaced daemon
    /// only), or stops asking: learning costs every switch of every thread on the node a
    /// helper call and a lookup.
    fn set_learning(&mut self, on: bool) -> Result<()> {
        if self.config.learn == u32::from(on) {
            return Ok(());
        }
        self.config.learn = u32::from(on);
        self.write_config("switching the kernel plane's id learning")
    }

    /// Stops learning once every process watched by the daemon's id has its kernel id.
    fn settle_learning(&mut self) {
        if self.config.learn == 0 {
            return;
        }
        let learned: Vec<(u32, u32)> = self.watched.iter().filter_map(|r| r.ok()).collect();
        let pending = self
            .watched_view
            .keys()
            .filter_map(|k| k.ok())
            .any(|v| !learned.iter().any(|&(_, view)| view == v));
        if pending {
            return;
        }
        // The probes trust a clear bit once learning stops: set them all first.
        for (tgid, _) in learned {
            if let Err(e) = self.tgids.set(tgid, true) {
                warn!("{e:#}: the probes go on learning");
                return;
            }
        }
        let _ = self.set_learning(false);
    }

    /// Hands out the deep-dive ring, mapped into this process for the capture (one at a
    /// time: None while another capture holds it, or if it cannot be mapped, said in the log).
    /// Outside captures the ring is not mapped: its pages (EVENT_RING_BYTES, every one of them
    /// touched by the first capture) would otherwise count in the daemon's RSS for good. The
    /// ring's read position lives in the map's consumer page, so a new mapping reads on where
    /// the last one stopped.
    pub fn take_ring(&mut self) -> Option<RingBuf<MapData>> {
        if self.ring_out {
            return None;
        }
        let mapped = self
            .events
            .fd()
            .as_fd()
            .try_clone_to_owned()
            .map_err(anyhow::Error::from)
            .and_then(|fd| Ok(MapData::from_fd(fd)?))
            .and_then(|m| Ok(RingBuf::try_from(Map::RingBuf(m))?));
        match mapped {
            Ok(ring) => {
                self.ring_out = true;
                Some(ring)
            }
            Err(e) => {
                warn!("cannot map the kernel plane's event ring: {e:#}");
                None
            }
        }
    }

    /// Takes the deep-dive ring back after a capture and unmaps it, for the next one.
    pub fn return_ring(&mut self, ring: RingBuf<MapData>) {
        drop(ring);
        self.ring_out = false;
    }

    /// Whether `pid` is being accounted.
    pub fn is_watched(&self, pid: u32) -> bool {
        if self.namespaced() {
            self.watched_view.get(&pid, 0).is_ok()
        } else {
            self.watched.get(&pid, 0).is_ok()
        }
    }

    /// Deep-dive events dropped so far because the ring was full.
    pub fn lost_events(&self) -> u64 {
        self.lost.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0)
    }

    /// Reads every accumulator now, by the daemon's ids (`ThreadStats::tgid` too). Threads
    /// whose id the daemon has not learned yet are left out.
    pub fn snapshot(&mut self) -> Snapshot {
        let (mut snap, view_of) = self.read_threads();
        for (k, v) in self.syscalls.iter().filter_map(|r| r.ok()) {
            if let Some(&tid) = view_of.get(&k.tid) {
                snap.syscalls.insert((tid, k.nr), v);
            }
        }
        snap
    }

    /// [`KernelPlane::snapshot`] without the syscall accumulators (`syscalls` stays empty):
    /// reading them takes two map syscalls per (thread, syscall) pair.
    pub fn snapshot_threads(&mut self) -> Snapshot {
        self.read_threads().0
    }

    /// The threads' accumulators, and each kernel thread id's id in the daemon's view.
    fn read_threads(&mut self) -> (Snapshot, StdHashMap<u32, u32>) {
        self.settle_learning();
        let mut snap = Snapshot::default();
        let mut view_of = StdHashMap::new();
        for (tid, mut s) in self.threads.iter().filter_map(|r| r.ok()) {
            if s.view_tid == 0 {
                continue;
            }
            view_of.insert(tid, s.view_tid);
            s.tgid = s.view_tgid;
            if s.exited == 0 {
                let open = clock::monotonic_ns().saturating_sub(s.mark_ns);
                match s.state {
                    state::RUNNING | state::UNKNOWN_RUNNABLE => s.on_cpu_ns += open,
                    state::RUNNABLE => s.runq_wait_ns += open,
                    state::BLOCKED => s.blocked_ns += open,
                    _ => {}
                }
            }
            snap.threads.insert(s.view_tid, s);
        }
        snap.lost_events = self.lost_events();
        snap.taken_ns = clock::monotonic_ns();
        (snap, view_of)
    }

    /// Turns on the kernel's per-program run-time statistics (BPF_ENABLE_STATS) while
    /// this plane lives.
    /// With them, the empty program ([`prog::EMPTY`]) runs on sched_switch beside the hooks
    /// where tp_btf is in use: its figure is the statistics' own cost.
    pub fn enable_run_stats(&mut self, features: &Features) -> Result<()> {
        let fd = aya::sys::enable_stats(aya::sys::Stats::RunTime)
            .context("enabling BPF run-time statistics")?;
        self.run_stats = Some(fd);
        let btf_in_use = self.hooks.iter().any(|h| h.kind == AttachKind::TpBtf);
        if btf_in_use && !self.hooks.iter().any(|h| h.program == prog::EMPTY) {
            let btf = Btf::parse_file(&features.paths.btf, Endianness::default())
                .context("parsing the kernel's BTF")?;
            let p: &mut BtfTracePoint = program(&mut self.ebpf, prog::EMPTY)?.try_into()?;
            p.load("sched_switch", &btf)?;
            // The link lives as long as the program, which the plane keeps.
            p.attach()?;
            self.hooks.push(Hook {
                tracepoint: "sched_switch",
                program: prog::EMPTY,
                kind: AttachKind::TpBtf,
            });
        }
        Ok(())
    }

    /// The hooks and how each is attached.
    pub fn hooks(&self) -> &[Hook] {
        &self.hooks
    }

    /// Cumulative run count and run time of every attached program.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        self.hooks
            .iter()
            .filter_map(|h| {
                let info = self.ebpf.program(h.program)?.info().ok()?;
                Some(ProgramStats {
                    tracepoint: h.tracepoint.to_string(),
                    program: h.program.to_string(),
                    run_count: info.run_count(),
                    run_time_ns: u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX),
                })
            })
            .collect()
    }
}

/// Attaches every hook: tp_btf when the kernel takes it (and `--hooks` allows it), else the
/// raw_tracepoint twin.
fn attach_all(
    ebpf: &mut Ebpf,
    btf: &Btf,
    features: &Features,
) -> Result<(Vec<Hook>, Vec<SyscallLink>)> {
    let mut hooks = Vec::new();
    let mut syscall_links = Vec::new();
    let try_btf = features.btf && features.paths.hooks == features::Hooks::Auto;
    for (btf_prog, raw_prog, tp) in prog::HOOKS {
        if try_btf {
            let p: &mut BtfTracePoint = ebpf
                .program_mut(btf_prog)
                .ok_or_else(|| anyhow!("eBPF object has no program {btf_prog}"))?
                .try_into()?;
            match p
                .load(tp, btf)
                .map_err(anyhow::Error::from)
                .and_then(|()| Ok(p.attach()?))
            {
                Ok(link) => {
                    if is_syscall_hook(tp) {
                        syscall_links.push(SyscallLink::Btf(btf_prog, link));
                    }
                    hooks.push(Hook {
                        tracepoint: tp,
                        program: btf_prog,
                        kind: AttachKind::TpBtf,
                    });
                    continue;
                }
                Err(e) => warn!("tp_btf {tp} refused ({e:#}); falling back to raw_tracepoint"),
            }
        }
        let p: &mut RawTracePoint = ebpf
            .program_mut(raw_prog)
            .ok_or_else(|| anyhow!("eBPF object has no program {raw_prog}"))?
            .try_into()?;
        p.load()
            .with_context(|| format!("loading the raw_tracepoint program for {tp}"))?;
        let link = p
            .attach(tp)
            .with_context(|| format!("attaching to raw tracepoint {tp}"))?;
        if is_syscall_hook(tp) {
            syscall_links.push(SyscallLink::Raw(raw_prog, link));
        }
        hooks.push(Hook {
            tracepoint: tp,
            program: raw_prog,
            kind: AttachKind::RawTracepoint,
        });
    }
    Ok((hooks, syscall_links))
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("eBPF object has no program {name}"))
}

fn is_syscall_hook(tracepoint: &str) -> bool {
    matches!(tracepoint, "sys_enter" | "sys_exit")
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; lift the soft limit to the
/// hard one (best effort: newer kernels do not need it).
fn raise_memlock_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls with valid pointers.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim);
        }
    }
}

/// How long to let the probes run before a measurement window opens, so running threads
/// get their first switch events.
pub const WARMUP: Duration = Duration::from_millis(100);
