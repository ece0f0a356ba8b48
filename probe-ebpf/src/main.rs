//! Kernel plane of stallscope: per-thread scheduler and syscall accounting for watched
//! processes, plus a raw event stream for deep dives.
//!
//! Every hook exists as a `tp_btf` program and a `raw_tracepoint` twin. Both kinds of
//! context are an array of `u64` arguments, so each pair shares one body (sys_exit's told
//! how it may read the registers an argument points to); userspace loads whichever kind the
//! kernel accepts.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::{
        bpf_pidns_info, BPF_ANY, BPF_NOEXIST, BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP,
        BPF_RB_NO_WAKEUP,
    },
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_ns_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, map, raw_tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{BtfTracePointContext, RawTracePointContext},
    EbpfContext, Global,
};
use probe_common::{
    event, hist_bucket, state, Config, Event, SyscallKey, SyscallStats, ThreadStats,
    EVENT_RING_BYTES, HIST_BUCKETS, MAX_SYSCALL_KEYS, MAX_THREADS, MAX_WATCHED, OUTSIDE_VIEW,
    SYS_SCHED_YIELD, TGID_WORDS, YIELD_RUN_GAP_NS,
};

#[map]
static WATCHED: HashMap<u32, u32> = HashMap::with_max_entries(MAX_WATCHED, 0);
#[map]
static WATCHED_VIEW: HashMap<u32, u32> = HashMap::with_max_entries(MAX_WATCHED, 0);
#[map]
static WATCHED_TGIDS: Array<u64> = Array::with_max_entries(TGID_WORDS, 0);
#[map]
static CONFIG: Array<Config> = Array::with_max_entries(1, 0);
#[map]
static THREAD_STATS: HashMap<u32, ThreadStats> = HashMap::with_max_entries(MAX_THREADS, 0);
#[map]
static SYSCALL_STATS: HashMap<SyscallKey, SyscallStats> =
    HashMap::with_max_entries(MAX_SYSCALL_KEYS, 0);
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENT_RING_BYTES, 0);
#[map]
static LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Byte offsets of `pid` and `tgid` in `struct task_struct`, from the running kernel's BTF.
/// The loader writes them into `.rodata`, which aya creates read-only for programs and
/// freezes: the verifier then reads them as constants (`bpf_map_direct_read` in
/// kernel/bpf/verifier.c), so a tp_btf program loads the fields directly, each load checked
/// against the type, instead of calling a helper.
#[unsafe(no_mangle)]
static TASK_PID_OFF: Global<u32> = Global::new(0);
#[unsafe(no_mangle)]
static TASK_TGID_OFF: Global<u32> = Global::new(0);

/// x86_64 syscall numbers whose positive return value is a byte count sent or received.
const SYS_SENDTO: u32 = 44;
const SYS_RECVFROM: u32 = 45;
const SYS_SENDMSG: u32 = 46;
const SYS_RECVMSG: u32 = 47;
const NO_SYSCALL: u32 = u32::MAX;

/// How a program may read the kernel structures (`task_struct`, `pt_regs`) its tracepoint
/// passes pointers to.
#[derive(Clone, Copy)]
enum Args {
    /// tp_btf: the arguments are typed kernel pointers, loaded from directly (the verifier
    /// checks the offset against the type; the JIT catches a fault).
    Typed,
    /// raw_tracepoint: plain numbers, read through bpf_probe_read_kernel.
    Untyped,
}

#[inline(always)]
fn arg(ctx: *mut core::ffi::c_void, n: usize) -> u64 {
    // SAFETY: both tp_btf and raw_tracepoint contexts are arrays of u64 arguments; every
    // caller reads an index within the tracepoint's argument count.
    unsafe { *(ctx as *const u64).add(n) }
}

/// CLOCK_MONOTONIC in ns, the clock of every timestamp the probes keep or emit.
#[inline(always)]
fn now_ns() -> u64 {
    // SAFETY: the helper takes no argument and only reads the clock.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
fn config() -> Option<&'static Config> {
    CONFIG.get(0)
}

/// The daemon's id of `tgid` if its threads are accounted (consulted when a thread is
/// created, and for a daemon outside the host's PID namespace when an unknown thread switches
/// out; every other hook finds watched threads by their entry in THREAD_STATS, which
/// userspace seeds when it starts watching a process where it can).
#[inline(always)]
fn watched(cfg: &Config, tgid: u32) -> Option<u32> {
    if tgid == 0 || tgid == cfg.self_tgid {
        return None;
    }
    // SAFETY: a plain u32 read from the map's value; userspace only inserts and removes it.
    unsafe { WATCHED.get(tgid) }.copied()
}

/// Whether a thread of process `tgid` (kernel id) may be accounted: its bit in
/// WATCHED_TGIDS, or any process while the probes are learning kernel ids. Tested before
/// any hash lookup: the verifier inlines this array read, which is all that events of
/// unwatched processes cost.
#[inline(always)]
fn maybe_watched(cfg: &Config, tgid: u32) -> bool {
    if cfg.learn != 0 {
        return true;
    }
    // Every tgid the kernel can hand out has its word; `get` fails only beyond that.
    WATCHED_TGIDS
        .get(tgid / 64)
        .is_none_or(|word| word & (1 << (tgid % 64)) != 0)
}

/// Whether the daemon sees other ids than the kernel's (it runs in a PID namespace of its
/// own, e.g. as a sidecar sharing the engine pod's).
#[inline(always)]
fn namespaced(cfg: &Config) -> bool {
    cfg.view_ino != 0
}

/// The current task's (tid, tgid) in the daemon's PID namespace; None when it is not in that
/// namespace.
#[inline(always)]
fn current_view(cfg: &Config) -> Option<(u32, u32)> {
    let mut info = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: `info` is a valid, writable bpf_pidns_info of the size passed.
    let r = unsafe {
        bpf_get_ns_current_pid_tgid(
            cfg.view_dev,
            cfg.view_ino,
            &mut info,
            size_of::<bpf_pidns_info>() as u32,
        )
    };
    (r == 0).then_some((info.pid, info.tgid))
}

/// For a namespaced daemon: the accumulators of the current, untracked thread `tid` of
/// `tgid`, made now if its process is watched. A process is known by the daemon's id until
/// one of its threads runs here ([`Config::learn`]); its kernel id is then recorded in
/// WATCHED, and its other threads are added as each first switches out.
#[inline(always)]
fn learn_current(cfg: &Config, tid: u32, tgid: u32, now: u64) -> Option<&'static mut ThreadStats> {
    let view_tgid = match watched(cfg, tgid) {
        Some(v) => v,
        None => {
            if cfg.learn == 0 {
                return None;
            }
            let (_, view_tgid) = current_view(cfg)?;
            // SAFETY: tested for presence only.
            unsafe { WATCHED_VIEW.get(view_tgid) }?;
            WATCHED.insert(tgid, view_tgid, BPF_ANY as u64).ok()?;
            view_tgid
        }
    };
    let (view_tid, _) = current_view(cfg)?;
    let fresh = ThreadStats {
        tgid,
        state: state::RUNNING,
        mark_ns: now,
        sys_nr: NO_SYSCALL,
        view_tid,
        view_tgid,
        ..ThreadStats::default()
    };
    THREAD_STATS.insert(tid, fresh, BPF_NOEXIST as u64).ok()?;
    tracked(tid, Some(tgid))
}

/// The id events give a thread: the daemon's view of a tracked one; else the kernel's id
/// when the daemon sees those, [`OUTSIDE_VIEW`] when it does not.
#[inline(always)]
fn view_tid(cfg: &Config, tid: u32, view: u32) -> u32 {
    if view != 0 {
        view
    } else if namespaced(cfg) {
        OUTSIDE_VIEW
    } else {
        tid
    }
}

/// A `u32` field of a `struct task_struct *`, at one of the offsets above.
#[inline(always)]
fn task_field(args: Args, task: u64, offset: &Global<u32>) -> u32 {
    let offset = u64::from(offset.load());
    match args {
        // SAFETY: `task` is a typed task_struct pointer and the offset a constant the
        // verifier checks against that type; the JIT turns a fault into a read of 0.
        Args::Typed => unsafe { *((task + offset) as *const u32) },
        // SAFETY: bpf_probe_read_kernel checks the address and fails (read as 0) instead of
        // faulting.
        Args::Untyped => {
            unsafe { bpf_probe_read_kernel((task + offset) as *const u32) }.unwrap_or(0)
        }
    }
}

/// The task's process id and thread id.
#[inline(always)]
fn task_ids(args: Args, task: u64) -> (u32, u32) {
    (
        task_field(args, task, &TASK_TGID_OFF),
        task_field(args, task, &TASK_PID_OFF),
    )
}

/// The accumulators of a watched, live thread. `tgid`, when known, guards against a
/// recycled tid whose old entry has not been reaped yet.
#[inline(always)]
fn tracked(tid: u32, tgid: Option<u32>) -> Option<&'static mut ThreadStats> {
    // SAFETY: the pointer is to the map's value, which stays allocated while this program
    // runs (the kernel holds the RCU read lock for it). Hooks of other CPUs may write the
    // same entry at once (a wakeup of this thread); the fields are plain integers, so a race
    // costs at most one interval's accounting, never memory safety.
    let s = unsafe { &mut *THREAD_STATS.get_ptr_mut(tid)? };
    if s.exited != 0 || tgid.is_some_and(|t| t != s.tgid) {
        return None;
    }
    Some(s)
}

/// The current thread's id and tgid, and its accumulators if it is watched.
#[inline(always)]
fn current_thread(cfg: &Config) -> (u32, u32, Option<&'static mut ThreadStats>) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (tid, tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    let stats = if maybe_watched(cfg, tgid) {
        tracked(tid, Some(tgid))
    } else {
        None
    };
    (tid, tgid, stats)
}

/// Appends one deep-dive event without waking the reader unless the ring is filling up.
#[inline(always)]
fn emit(cfg: &Config, kind: u32, tid: u32, ts_ns: u64, arg0: u64, arg1: u64) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut slot) => {
            slot.write(Event {
                ts_ns,
                kind: kind as u16,
                // SAFETY: the helper takes no argument and only reads this CPU's id.
                cpu: unsafe { bpf_get_smp_processor_id() } as u16,
                tid,
                arg0,
                arg1,
            });
            let flags = if EVENTS.query(BPF_RB_AVAIL_DATA as u64) >= cfg.wake_threshold {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            };
            slot.submit(flags as u64);
        }
        None => {
            if let Some(lost) = LOST.get_ptr_mut(0) {
                // SAFETY: this CPU's own slot of a per-CPU array, allocated for the map's
                // life. Only a program nested on this CPU (a wakeup from an interrupt inside a
                // syscall hook) can write it at the same time, which may lose one count of a
                // loss counter; never memory safety.
                unsafe { *lost += 1 };
            }
        }
    }
}

/// Ends `s`'s run of `sched_yield` calls, if one is open: streams its last exit with the
/// number of calls (unless the run began before this deep dive).
#[inline(always)]
fn end_yield_run(cfg: &Config, s: &mut ThreadStats, id: u32) {
    if s.yield_run_ns == 0 {
        return;
    }
    if s.yield_run_ns >= cfg.deep_dive_since_ns {
        emit(
            cfg,
            event::YIELDS,
            id,
            s.yield_last_exit_ns,
            u64::from(SYS_SCHED_YIELD),
            s.yield_calls,
        );
    }
    s.yield_run_ns = 0;
}

/// sched_switch(bool preempt, task_struct *prev, task_struct *next, unsigned int prev_state)
#[inline(always)]
fn on_sched_switch(ctx: *mut core::ffi::c_void, args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    // At this tracepoint `current` is still `prev`.
    let pid_tgid = bpf_get_current_pid_tgid();
    let (prev_tid, prev_tgid) = (pid_tgid as u32, (pid_tgid >> 32) as u32);
    let next_task = arg(ctx, 2);
    let next_tgid = task_field(args, next_task, &TASK_TGID_OFF);
    let prev_maybe = maybe_watched(cfg, prev_tgid);
    let next_maybe = maybe_watched(cfg, next_tgid);
    if !prev_maybe && !next_maybe {
        return 0;
    }
    let mut prev = if prev_maybe {
        tracked(prev_tid, Some(prev_tgid))
    } else {
        None
    };
    // Read even for an unwatched `next`: a deep dive names who took the CPU.
    let next_tid = task_field(args, next_task, &TASK_PID_OFF);
    let next = if next_maybe && next_tid != 0 {
        tracked(next_tid, Some(next_tgid))
    } else {
        None
    };
    let preempt = arg(ctx, 0) & 0xff != 0;
    let prev_state = arg(ctx, 3) as u32;
    // The clock is read only when a watched thread is involved. (Each side is handled in
    // its own branch: testing both pointers at once makes LLVM OR them, which the
    // verifier rejects.)
    let mut now = 0;
    let mut involved = false;
    let (mut prev_view, mut next_view) = (0, 0);

    if prev.is_none() && prev_maybe && namespaced(cfg) {
        now = now_ns();
        prev = learn_current(cfg, prev_tid, prev_tgid, now);
    }
    if let Some(s) = prev {
        if now == 0 {
            now = now_ns();
        }
        involved = true;
        // A thread created since its process was learned gets its view id here.
        if s.view_tid == 0 && namespaced(cfg) {
            if let Some((tid, _)) = current_view(cfg) {
                s.view_tid = tid;
            }
        }
        prev_view = s.view_tid;
        // Switched out between two calls of a run: the run ends before the switch, so that
        // the timeline does not take a preemption for a yield.
        if cfg.deep_dive != 0 && s.sys_nr != SYS_SCHED_YIELD {
            end_yield_run(cfg, s, view_tid(cfg, prev_tid, prev_view));
        }
        if s.state == state::RUNNING || s.state == state::UNKNOWN_RUNNABLE {
            s.on_cpu_ns += now.saturating_sub(s.mark_ns);
        }
        if preempt || prev_state == 0 {
            s.nivcsw += 1;
            s.state = state::RUNNABLE;
        } else {
            s.nvcsw += 1;
            s.state = state::BLOCKED;
        }
        s.mark_ns = now;
    }
    if let Some(s) = next {
        if !involved {
            now = now_ns();
            involved = true;
        }
        next_view = s.view_tid;
        let waited = now.saturating_sub(s.mark_ns);
        match s.state {
            state::RUNNABLE | state::UNKNOWN_RUNNABLE => s.runq_wait_ns += waited,
            // The wakeup was not seen (the thread was blocked since we first saw it).
            state::BLOCKED => s.blocked_ns += waited,
            _ => {}
        }
        s.state = state::RUNNING;
        s.mark_ns = now;
    }
    if cfg.deep_dive != 0 && involved {
        let flags = prev_state as u64 | (preempt as u64) << 32;
        let (prev_id, next_id) = (
            view_tid(cfg, prev_tid, prev_view),
            view_tid(cfg, next_tid, next_view),
        );
        emit(cfg, event::SWITCH, prev_id, now, next_id as u64, flags);
    }
    0
}

/// sched_wakeup(task_struct *p)
#[inline(always)]
fn on_wakeup(ctx: *mut core::ffi::c_void, args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    let (tgid, tid) = task_ids(args, arg(ctx, 0));
    if !maybe_watched(cfg, tgid) {
        return 0;
    }
    let Some(s) = tracked(tid, None) else {
        return 0;
    };
    let now = now_ns();
    if s.state == state::BLOCKED {
        s.blocked_ns += now.saturating_sub(s.mark_ns);
        s.state = state::RUNNABLE;
        s.mark_ns = now;
    }
    if cfg.deep_dive != 0 {
        let id = view_tid(cfg, tid, s.view_tid);
        emit(cfg, event::WAKEUP, id, now, s.view_tgid as u64, 0);
    }
    0
}

/// sched_wakeup_new(task_struct *p): a new thread; tracked if its process is watched.
#[inline(always)]
fn on_wakeup_new(ctx: *mut core::ffi::c_void, args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    let (tgid, tid) = task_ids(args, arg(ctx, 0));
    if !maybe_watched(cfg, tgid) {
        return 0;
    }
    let Some(view_tgid) = watched(cfg, tgid) else {
        return 0;
    };
    let now = now_ns();
    // A namespaced daemon learns the new thread's id when it first switches out.
    let view = if namespaced(cfg) { 0 } else { tid };
    let fresh = ThreadStats {
        tgid,
        state: state::RUNNABLE,
        mark_ns: now,
        sys_nr: NO_SYSCALL,
        view_tid: view,
        view_tgid,
        ..ThreadStats::default()
    };
    // A new thread: replace whatever a previous owner of this tid left behind.
    let _ = THREAD_STATS.insert(tid, fresh, BPF_ANY as u64);
    if cfg.deep_dive != 0 {
        emit(
            cfg,
            event::WAKEUP,
            view_tid(cfg, tid, view),
            now,
            view_tgid as u64,
            1,
        );
    }
    0
}

/// sched_process_exit(task_struct *p, ...): `current` is the exiting thread.
#[inline(always)]
fn on_exit(_ctx: *mut core::ffi::c_void, _args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    let (tid, _, Some(s)) = current_thread(cfg) else {
        return 0;
    };
    let now = now_ns();
    s.exited = 1;
    s.exit_ns = now;
    s.exit_comm = bpf_get_current_comm().unwrap_or_default();
    if cfg.deep_dive != 0 {
        let id = view_tid(cfg, tid, s.view_tid);
        end_yield_run(cfg, s, id);
        emit(cfg, event::EXIT, id, now, 0, 0);
    }
    0
}

/// sys_enter(struct pt_regs *regs, long id)
#[inline(always)]
fn on_sys_enter(ctx: *mut core::ffi::c_void, _args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    // Before any map lookup: an engine core spinning in sched_yield makes ~270k of them a
    // second, and this filter is most of what they cost.
    if !cfg.accounts(arg(ctx, 1)) {
        return 0;
    }
    let (tid, _, Some(s)) = current_thread(cfg) else {
        return 0;
    };
    let now = now_ns();
    let nr = arg(ctx, 1) as u32;
    s.sys_nr = nr;
    s.sys_enter_ns = now;
    if cfg.deep_dive != 0 {
        let id = view_tid(cfg, tid, s.view_tid);
        if nr == SYS_SCHED_YIELD {
            // A spin of sched_yield streams one entry and one exit per run, not two events
            // a call (vLLM's engine core makes ~300k calls a second while it waits).
            if s.yield_run_ns != 0
                && now.saturating_sub(s.yield_last_exit_ns) <= YIELD_RUN_GAP_NS
                && s.yield_run_ns >= cfg.deep_dive_since_ns
            {
                s.yield_calls += 1;
                return 0;
            }
            end_yield_run(cfg, s, id);
            s.yield_run_ns = now;
            s.yield_last_exit_ns = now;
            s.yield_calls = 1;
        } else {
            end_yield_run(cfg, s, id);
        }
        emit(cfg, event::SYS_ENTER, id, now, nr as u64, 0);
    }
    0
}

/// `orig_ax` in x86-64's `struct pt_regs`: fixed by the ptrace ABI (`ORIG_RAX * 8`).
const X86_ORIG_AX: u64 = 15 * 8;

/// The syscall number in a sys_exit's registers, if it can be read.
#[inline(always)]
fn syscall_nr(ctx: *mut core::ffi::c_void, args: Args, cfg: &Config) -> Option<u64> {
    match args {
        // SAFETY: the first argument of sys_exit is the task's pt_regs, and orig_ax lies
        // inside it; the verifier only accepts this load as a checked one.
        Args::Typed if cfg.regs_nr_off as u64 == X86_ORIG_AX => {
            Some(unsafe { *((arg(ctx, 0) + X86_ORIG_AX) as *const u64) })
        }
        Args::Typed | Args::Untyped if cfg.regs_nr_off != 0 => {
            // SAFETY: bpf_probe_read_kernel checks the address and fails instead of
            // faulting; the offset is the syscall number's, from BTF.
            unsafe {
                bpf_probe_read_kernel((arg(ctx, 0) + u64::from(cfg.regs_nr_off)) as *const u64)
            }
            .ok()
        }
        _ => None,
    }
}

/// sys_exit(struct pt_regs *regs, long ret)
#[inline(always)]
fn on_sys_exit(ctx: *mut core::ffi::c_void, args: Args) -> u32 {
    let Some(cfg) = config() else { return 0 };
    // A syscall entered unaccounted left sys_nr unset: the full path below would find
    // NO_SYSCALL and stop too, after a map lookup.
    if syscall_nr(ctx, args, cfg).is_some_and(|nr| !cfg.accounts(nr)) {
        return 0;
    }
    let (tid, _, Some(s)) = current_thread(cfg) else {
        return 0;
    };
    let nr = s.sys_nr;
    if nr == NO_SYSCALL {
        return 0;
    }
    if s.sys_enter_ns < cfg.syscalls_since_ns {
        s.sys_nr = NO_SYSCALL;
        return 0;
    }
    let now = now_ns();
    let ret = arg(ctx, 1) as i64;
    let id = view_tid(cfg, tid, s.view_tid);
    s.sys_nr = NO_SYSCALL;
    let latency = now.saturating_sub(s.sys_enter_ns);
    if ret > 0 {
        match nr {
            SYS_SENDTO | SYS_SENDMSG => s.net_tx_bytes += ret as u64,
            SYS_RECVFROM | SYS_RECVMSG => s.net_rx_bytes += ret as u64,
            _ => {}
        }
    }
    let key = SyscallKey { tid, nr };
    if SYSCALL_STATS.get_ptr_mut(key).is_none() {
        let _ = SYSCALL_STATS.insert(key, SyscallStats::default(), BPF_NOEXIST as u64);
    }
    if let Some(sc) = SYSCALL_STATS.get_ptr_mut(key) {
        // SAFETY: as in `tracked`: the map's value outlives this run; only this thread's own
        // syscall exits write its key.
        let sc = unsafe { &mut *sc };
        sc.count += 1;
        sc.total_ns += latency;
        sc.hist[hist_bucket(latency) & (HIST_BUCKETS - 1)] += 1;
    }
    if cfg.deep_dive != 0 {
        if nr == SYS_SCHED_YIELD && s.yield_run_ns != 0 {
            s.yield_last_exit_ns = now;
        } else {
            emit(cfg, event::SYS_EXIT, id, now, nr as u64, ret as u64);
        }
    }
    0
}

macro_rules! hook_pair {
    ($btf:ident, $raw:ident, $tp:literal, $body:path) => {
        #[btf_tracepoint(function = $tp)]
        pub fn $btf(ctx: BtfTracePointContext) -> u32 {
            $body(ctx.as_ptr(), Args::Typed)
        }
        #[raw_tracepoint(tracepoint = $tp)]
        pub fn $raw(ctx: RawTracePointContext) -> i32 {
            $body(ctx.as_ptr(), Args::Untyped) as i32
        }
    };
}

hook_pair!(
    btf_sched_switch,
    raw_sched_switch,
    "sched_switch",
    on_sched_switch
);
hook_pair!(
    btf_sched_wakeup,
    raw_sched_wakeup,
    "sched_wakeup",
    on_wakeup
);
hook_pair!(
    btf_sched_wakeup_new,
    raw_sched_wakeup_new,
    "sched_wakeup_new",
    on_wakeup_new
);
hook_pair!(
    btf_sched_process_exit,
    raw_sched_process_exit,
    "sched_process_exit",
    on_exit
);
hook_pair!(btf_sys_enter, raw_sys_enter, "sys_enter", on_sys_enter);
hook_pair!(btf_sys_exit, raw_sys_exit, "sys_exit", on_sys_exit);

/// Does nothing. `stallscope probe --prog-stats` attaches it beside the hooks: its run time
/// per event is what the statistics themselves add to every program's figure (the kernel
/// reads the clock around each run), the floor below which no hook can be measured.
#[btf_tracepoint(function = "sched_switch")]
pub fn btf_empty_sched_switch(_ctx: BtfTracePointContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
