//! Types shared between the kernel programs (`probe-ebpf`) and userspace (`probe-user`).
//!
//! Everything here is `repr(C)`, plain old data, and laid out so that the kernel and
//! userspace agree byte for byte. Timestamps are nanoseconds on CLOCK_MONOTONIC
//! (`bpf_ktime_get_ns`).
#![no_std]

/// Maximum number of threads tracked at once (size of [`map::THREAD_STATS`]).
pub const MAX_THREADS: u32 = 32 * 1024;
/// Maximum number of (thread, syscall) pairs tracked at once.
pub const MAX_SYSCALL_KEYS: u32 = 16 * 1024;
/// Maximum number of watched processes.
pub const MAX_WATCHED: u32 = 4096;
/// Words of [`map::WATCHED_TGIDS`]: one bit for every process id up to the kernel's
/// `PID_MAX_LIMIT` on 64-bit (2^22, the most `kernel.pid_max` can be raised to): 512 KiB.
pub const TGID_WORDS: u32 = (1 << 22) / 64;
/// Number of log2 buckets in a syscall latency histogram: bucket `i` counts latencies
/// in `[2^i, 2^(i+1))` ns; the last bucket also takes everything longer.
pub const HIST_BUCKETS: usize = 32;
/// Size of the deep-dive event ring in bytes (a power of two, multiple of the page size).
pub const EVENT_RING_BYTES: u32 = 16 * 1024 * 1024;

/// Names of the maps, as the loader looks them up.
pub mod map {
    /// `HashMap<u32 tgid, u32 view tgid>`: processes whose threads are accounted, keyed by
    /// their id in the kernel's (initial) PID namespace, with their id in the daemon's.
    pub const WATCHED: &str = "WATCHED";
    /// `HashMap<u32 view tgid, u32 unused>`: processes to watch, by their id in the daemon's
    /// PID namespace, whose kernel id is not known yet (a daemon outside the host's PID
    /// namespace only; see [`super::Config::view_ino`]).
    pub const WATCHED_VIEW: &str = "WATCHED_VIEW";
    /// `Array<u64>` of [`super::TGID_WORDS`] words: bit `tgid % 64` of word `tgid / 64` is set
    /// while the kernel id `tgid` is in [`WATCHED`]. Every hook tests it before any hash
    /// lookup, so that events of processes nobody watches (nearly all of a node's) cost an
    /// inlined array read. Only userspace writes it (one writer, no lost updates); a clear bit
    /// is trusted only while [`super::Config::learn`] is 0, since learning adds to
    /// [`WATCHED`] from the kernel side.
    pub const WATCHED_TGIDS: &str = "WATCHED_TGIDS";
    /// `Array<Config>` with one entry.
    pub const CONFIG: &str = "CONFIG";
    /// `HashMap<u32 tid, ThreadStats>`.
    pub const THREAD_STATS: &str = "THREAD_STATS";
    /// `HashMap<SyscallKey, SyscallStats>`.
    pub const SYSCALL_STATS: &str = "SYSCALL_STATS";
    /// `RingBuf` of [`super::Event`] (deep-dive mode only).
    pub const EVENTS: &str = "EVENTS";
    /// `PerCpuArray<u64>` with one entry: events dropped because the ring was full.
    pub const LOST: &str = "LOST";
}

/// Names of the programs' read-only globals, which the loader sets before loading.
pub mod global {
    /// `u32`: byte offset of `pid` in `struct task_struct` (from the kernel's BTF).
    pub const TASK_PID_OFF: &str = "TASK_PID_OFF";
    /// `u32`: byte offset of `tgid` in `struct task_struct` (from the kernel's BTF).
    pub const TASK_TGID_OFF: &str = "TASK_TGID_OFF";
}

/// Names of the kernel programs. Each hook exists twice in the object: a `tp_btf`
/// program (preferred) and a `raw_tracepoint` twin used when BTF tracing programs
/// cannot be loaded. Both read the same arguments and share one body.
pub mod prog {
    /// `(tp_btf program, raw_tracepoint program, tracepoint name)` for every hook.
    pub const HOOKS: [(&str, &str, &str); 6] = [
        ("btf_sched_switch", "raw_sched_switch", "sched_switch"),
        ("btf_sched_wakeup", "raw_sched_wakeup", "sched_wakeup"),
        (
            "btf_sched_wakeup_new",
            "raw_sched_wakeup_new",
            "sched_wakeup_new",
        ),
        (
            "btf_sched_process_exit",
            "raw_sched_process_exit",
            "sched_process_exit",
        ),
        ("btf_sys_enter", "raw_sys_enter", "sys_enter"),
        ("btf_sys_exit", "raw_sys_exit", "sys_exit"),
    ];
    /// A `tp_btf` program on sched_switch that does nothing: the measuring floor of run-time
    /// statistics.
    pub const EMPTY: &str = "btf_empty_sched_switch";
}

/// Run-time configuration written by userspace into `CONFIG[0]`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Config {
    /// TGID of the daemon itself: its threads are never accounted.
    pub self_tgid: u32,
    /// Non-zero while deep-dive mode streams raw events.
    pub deep_dive: u32,
    /// Wake the ring's reader once this many bytes are waiting (otherwise it drains on a timer).
    pub wake_threshold: u64,
    /// Device (kernel encoding) and inode of the daemon's PID namespace when that is not the
    /// host's, else 0: the ids the daemon sees. The probes key their maps by the kernel's ids
    /// (what `current` and task_struct hold) and translate into the daemon's with
    /// `bpf_get_ns_current_pid_tgid`, which only answers for the current task.
    pub view_dev: u64,
    /// See [`Config::view_dev`]; 0 when the daemon sees the host's ids.
    pub view_ino: u64,
    /// Non-zero while a process in [`map::WATCHED_VIEW`] has no kernel id yet: each thread
    /// switching out is then asked for its ids in the daemon's namespace.
    pub learn: u32,
    /// Byte offset of the syscall number in `struct pt_regs` (`orig_ax`, from kernel BTF), so
    /// that sys_exit can tell an unaccounted syscall without a map lookup; 0: unknown.
    pub regs_nr_off: u32,
    /// Syscalls (a bitmap of numbers below 512) left out of the accounting outside deep dives:
    /// their threads' time in them still counts as running or runnable. Deep dives account
    /// them all, and stream a spin of `sched_yield` as runs ([`event::YIELDS`]) so that the
    /// timeline still tells a yield from a preemption.
    pub unaccounted: [u64; UNACCOUNTED_WORDS],
    /// A syscall exit whose entry was seen before this (ns, CLOCK_MONOTONIC) is not accounted:
    /// the daemon attaches the syscall hooks for deep dives only, so a thread's last seen
    /// entry may belong to a syscall whose exit fell while they were detached.
    pub syscalls_since_ns: u64,
    /// When deep-dive mode last switched on (ns, CLOCK_MONOTONIC): a run of `sched_yield`
    /// begun before it belongs to an earlier deep dive and is not streamed.
    pub deep_dive_since_ns: u64,
}

/// Words of [`Config::unaccounted`].
pub const UNACCOUNTED_WORDS: usize = 8;

impl Config {
    /// Whether syscall `nr` is accounted right now.
    #[inline(always)]
    pub fn accounts(&self, nr: u64) -> bool {
        self.deep_dive != 0
            || nr >= (UNACCOUNTED_WORDS * 64) as u64
            || self.unaccounted[(nr / 64) as usize % UNACCOUNTED_WORDS] & (1 << (nr % 64)) == 0
    }
}

/// The id events carry for a thread the daemon cannot see (outside its PID namespace).
pub const OUTSIDE_VIEW: u32 = u32::MAX;

/// Scheduler state of a tracked thread, as last seen by the probes.
pub mod state {
    /// Seeded by userspace from `/proc` as runnable: running or waiting for a CPU.
    /// The first switch event tells which, and credits the interval accordingly.
    pub const UNKNOWN_RUNNABLE: u32 = 0;
    /// On a CPU since `ThreadStats::mark_ns`.
    pub const RUNNING: u32 = 1;
    /// On a run queue (woken or preempted) since `mark_ns`.
    pub const RUNNABLE: u32 = 2;
    /// Switched out while not runnable (sleeping, I/O, ...) since `mark_ns`.
    pub const BLOCKED: u32 = 3;
}

/// Per-thread accumulators (key: tid). Updated by the sched and syscall programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ThreadStats {
    /// TGID of the thread's process.
    pub tgid: u32,
    /// One of the [`state`] constants.
    pub state: u32,
    /// When the current state began (ns, CLOCK_MONOTONIC).
    pub mark_ns: u64,
    /// Total time on a CPU.
    pub on_cpu_ns: u64,
    /// Total time runnable but waiting for a CPU (wakeup or preemption → switch-in).
    pub runq_wait_ns: u64,
    /// Total time blocked (switch-out while not runnable → wakeup).
    pub blocked_ns: u64,
    /// Voluntary context switches.
    pub nvcsw: u64,
    /// Involuntary context switches (preemption, yield).
    pub nivcsw: u64,
    /// Bytes returned by send-family syscalls.
    pub net_tx_bytes: u64,
    /// Bytes returned by recv-family syscalls.
    pub net_rx_bytes: u64,
    /// Syscall in progress (`u32::MAX` when none).
    pub sys_nr: u32,
    /// Non-zero once the thread has exited.
    pub exited: u32,
    /// Entry time of the syscall in progress.
    pub sys_enter_ns: u64,
    /// Exit time, when `exited` is set.
    pub exit_ns: u64,
    /// Thread name captured at exit (NUL-padded), so exited threads stay identifiable.
    pub exit_comm: [u8; 16],
    /// The thread's id in the daemon's PID namespace; 0 until the thread first switches out
    /// when the daemon is outside the host's (the id can only be asked of the running task).
    pub view_tid: u32,
    /// The process's id in the daemon's PID namespace.
    pub view_tgid: u32,
    /// Deep dives only: entry time of the first `sched_yield` of the run of them the thread
    /// is in (0: none). A run is streamed as one entry and one [`event::YIELDS`].
    pub yield_run_ns: u64,
    /// Exit time of the run's last `sched_yield` so far.
    pub yield_last_exit_ns: u64,
    /// Calls in the run so far.
    pub yield_calls: u64,
}

/// Key of [`map::SYSCALL_STATS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SyscallKey {
    /// Thread id (the kernel's).
    pub tid: u32,
    /// Syscall number (x86_64 numbering on x86_64).
    pub nr: u32,
}

/// Per-(thread, syscall) accumulators.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyscallStats {
    /// Completed calls.
    pub count: u64,
    /// Total time from entry to exit.
    pub total_ns: u64,
    /// log2 latency histogram, see [`HIST_BUCKETS`].
    pub hist: [u64; HIST_BUCKETS],
}

impl Default for SyscallStats {
    fn default() -> Self {
        Self {
            count: 0,
            total_ns: 0,
            hist: [0; HIST_BUCKETS],
        }
    }
}

/// Kinds of deep-dive [`Event`].
pub mod event {
    /// Thread ids in events are the daemon's view of them ([`super::OUTSIDE_VIEW`] for threads
    /// it cannot see).
    ///
    /// `tid` = prev, `arg0` = next tid, `arg1` = prev_state | preempt << 32.
    pub const SWITCH: u32 = 1;
    /// `tid` = woken thread, `arg0` = its tgid (daemon's view), `arg1` = 1 for a new task.
    pub const WAKEUP: u32 = 2;
    /// `tid` = caller, `arg0` = syscall number.
    pub const SYS_ENTER: u32 = 3;
    /// `tid` = caller, `arg0` = syscall number, `arg1` = return value (as i64).
    pub const SYS_EXIT: u32 = 4;
    /// `tid` = exiting thread.
    pub const EXIT: u32 = 5;
    /// The exit of the last call of a run of `sched_yield` (a spin-wait): `tid` = caller,
    /// `arg0` = syscall number, `arg1` = calls in the run. The run's first entry is a
    /// [`SYS_ENTER`]; the calls between stream nothing. A run ends at the thread's next other
    /// syscall, at a switch out of it between two calls, at its exit, or when a call begins
    /// more than [`super::YIELD_RUN_GAP_NS`] after the previous one ended.
    pub const YIELDS: u32 = 6;
}

/// Longest user-mode gap between two `sched_yield` calls of one run (see [`event::YIELDS`]):
/// vLLM's engine core spins at one call every ~3 µs while it waits for its worker.
pub const YIELD_RUN_GAP_NS: u64 = 20_000;

/// `sched_yield`'s number on x86_64.
pub const SYS_SCHED_YIELD: u32 = 24;

/// One raw deep-dive event (32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Event {
    /// ns, CLOCK_MONOTONIC.
    pub ts_ns: u64,
    /// One of the [`event`] constants.
    pub kind: u16,
    /// CPU the event was recorded on.
    pub cpu: u16,
    /// Subject thread.
    pub tid: u32,
    /// Kind-specific.
    pub arg0: u64,
    /// Kind-specific.
    pub arg1: u64,
}

/// log2 bucket index of a latency.
#[inline(always)]
pub fn hist_bucket(ns: u64) -> usize {
    let b = 63 - (ns | 1).leading_zeros() as usize;
    if b >= HIST_BUCKETS {
        HIST_BUCKETS - 1
    } else {
        b
    }
}

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all types are repr(C), Copy, and valid for any bit pattern.
    unsafe impl aya::Pod for super::Config {}
    unsafe impl aya::Pod for super::ThreadStats {}
    unsafe impl aya::Pod for super::SyscallKey {}
    unsafe impl aya::Pod for super::SyscallStats {}
    unsafe impl aya::Pod for super::Event {}
}
