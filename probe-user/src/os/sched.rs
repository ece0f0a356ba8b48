//! Scheduling of the daemon's own background threads, which share the engine's cores.

use std::cell::Cell;

use log::{info, warn};

/// The CPU a background thread (the sentinel's fit, a deep dive's writer) may take: 1 ms of
/// every 10 ms, a SCHED_DEADLINE reservation. A fit is 20 ms of CPU at 300 samples and 0.13 s at
/// 4,000; it must finish soon, since no alert comes before the first one, yet never crowd out
/// the engine it shares the cores with. Neither fair-class setting does both on this kind of
/// host (kernel 6.18, EEVDF, autogroup): beside a pipelined vLLM under load on 2 vCPUs, a
/// process of 0.13 s of CPU took 0.13–23.8 s at SCHED_OTHER nice 0 and 0.13–23.2 s at
/// SCHED_BATCH nice 10 (runnable, not run: `/proc/PID/schedstat` counted 20.6 s of run-queue
/// wait), and a daemon's 300-sample fit took 148 s; under SCHED_IDLE a 1,000-sample fit waited
/// more than 8 minutes. At this reservation the same process took 1.33–1.43 s (SCHED_BATCH
/// nice 10 in turns beside it: 2.2–7.6 s). A deadline task runs ahead of every fair-class and
/// real-time thread within its runtime and is throttled to its next period once that is spent,
/// so it neither waits on the engine nor takes more than a tenth of one CPU from it, at most
/// 1 ms at a time.
const RESERVATION: Reservation = Reservation {
    runtime_ns: 1_000_000,
    period_ns: 10_000_000,
};

/// Where the kernel refuses the reservation: SCHED_BATCH (no preemption on wake-up) at this
/// nice value, which yields to the engine roughly 10:1 and may wait as long as above.
const FALLBACK_NICE: libc::c_int = 10;

/// `SCHED_DEADLINE` of include/uapi/linux/sched.h (libc does not name it).
const SCHED_DEADLINE: u32 = 6;

struct Reservation {
    runtime_ns: u64,
    period_ns: u64,
}

/// Puts the calling thread in the background: [`RESERVATION`], or where the kernel refuses it
/// (no CAP_SYS_NICE; a CPU affinity narrower than the root domain, as in a cpuset-pinned
/// container; the CPUs' deadline bandwidth taken), SCHED_BATCH at [`FALLBACK_NICE`]. The first
/// refusal is logged once per daemon, with its reason.
pub fn background() {
    let Err(refused) = reserve(&RESERVATION) else {
        return;
    };
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        info!(
            "background threads (fits, deep-dive writers) run at SCHED_BATCH nice {FALLBACK_NICE}, with no bound on how long the engine's threads delay them: SCHED_DEADLINE was refused ({refused}; it needs CAP_SYS_NICE and a CPU affinity spanning every CPU)"
        );
    });
    let batch = set_policy(libc::SCHED_BATCH, 0);
    // SAFETY: plain syscalls on the calling thread (Linux nice values are per thread).
    let niced = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            FALLBACK_NICE,
        )
    } == 0;
    if !(batch && niced) {
        warn!(
            "cannot lower a background thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// The calling thread at SCHED_DEADLINE with `r` (deadline = period). Threads and processes it
/// starts get the normal policy (SCHED_FLAG_RESET_ON_FORK; without it, the kernel refuses a
/// deadline task's fork).
fn reserve(r: &Reservation) -> std::io::Result<()> {
    let attr = libc::sched_attr {
        size: std::mem::size_of::<libc::sched_attr>() as u32,
        sched_policy: SCHED_DEADLINE,
        sched_flags: libc::SCHED_FLAG_RESET_ON_FORK as u64,
        sched_nice: 0,
        sched_priority: 0,
        sched_runtime: r.runtime_ns,
        sched_deadline: r.period_ns,
        sched_period: r.period_ns,
    };
    // SAFETY: pid 0 is the calling thread; attr is a valid sched_attr of the size it states,
    // read by the kernel during the call only.
    let rc = unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &attr as *const _, 0u32) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The real-time priority of the daemon's loop thread while it waits for and makes verdicts.
///
/// An iteration's end wakes the loop (its engine's doorbell). Under the normal policy that
/// wake waits its turn behind whatever saturates the CPUs: with three spinning processes on
/// 2 vCPUs, a 50 ms sleeper's wake came 3.6 ms late at p99, 7.9 ms when a nice-10 thread of
/// its own session burned CPU beside it (autogroup charges a session's threads to one
/// scheduling entity, so the daemon's own fits and deep-dive writers delay its loop), and
/// 0.10 ms under SCHED_FIFO (200 sleeps each). The thread is SCHED_FIFO only in the phases of
/// its loop on the verdicts' path (the wait, the engines' verdicts, a look at the deep dives:
/// microseconds per iteration) and drops to the normal policy for those that take
/// milliseconds (starting and stopping a capture, rescans, accounting), so it takes no more
/// CPU from the engine than before, only sooner. The kernel's RT throttling
/// (`sched_rt_runtime_us`) bounds what a runaway loop could take.
///
/// Needs CAP_SYS_NICE (or an RLIMIT_RTPRIO that allows the priority); under cgroup v1 with
/// RT group scheduling, a cgroup with `cpu.rt_runtime_us` above 0. Without them the loop
/// keeps the normal policy and one warning says so.
pub struct VerdictPriority {
    /// The SCHED_FIFO priority, 0 when the thread keeps the normal policy.
    priority: Cell<libc::c_int>,
    raised: Cell<bool>,
}

impl VerdictPriority {
    /// For the calling thread, at `priority` (1–99; 0 leaves it at the normal policy).
    pub fn new(priority: u8) -> Self {
        let p = Self {
            priority: Cell::new(priority.into()),
            raised: Cell::new(false),
        };
        p.raise();
        p
    }

    /// Whether the thread runs SCHED_FIFO while it waits.
    pub fn realtime(&self) -> bool {
        self.priority.get() > 0
    }

    /// Before the wait and the verdicts.
    pub fn raise(&self) {
        let priority = self.priority.get();
        if self.raised.get() || priority == 0 {
            return;
        }
        // SCHED_RESET_ON_FORK: a thread started from a verdict pass does not inherit the policy.
        if set_policy(libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, priority) {
            self.raised.set(true);
        } else {
            warn!(
                "the loop thread keeps the normal scheduling policy ([sentinel] verdict_priority = {priority}): {}; verdicts may wait behind the engine's threads (grant CAP_SYS_NICE, or set verdict_priority = 0 to silence this)",
                std::io::Error::last_os_error()
            );
            self.priority.set(0);
        }
    }

    /// Before the rest of a pass.
    pub fn lower(&self) {
        if self.raised.get() && set_policy(libc::SCHED_OTHER, 0) {
            self.raised.set(false);
        }
    }
}

fn set_policy(policy: libc::c_int, priority: libc::c_int) -> bool {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: pid 0 is the calling thread; param is valid for the call.
    unsafe { libc::sched_setscheduler(0, policy, &param) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's policy.
    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread.
        let policy = unsafe { libc::sched_getscheduler(0) };
        policy & !libc::SCHED_RESET_ON_FORK
    }

    #[test]
    fn a_background_thread_is_reserved_or_batched_and_can_start_threads() {
        let (own, child) = std::thread::spawn(|| {
            background();
            let child = std::thread::spawn(policy)
                .join()
                .expect("a thread started from it");
            (policy(), child)
        })
        .join()
        .unwrap();
        // As root (CI) on every CPU the reservation is granted; elsewhere the fallback.
        // SAFETY: geteuid and sysconf have no preconditions; a zeroed cpu_set_t is a valid
        // empty set, filled by the kernel for the calling thread (pid 0).
        let everywhere = unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) == 0
                && i64::from(libc::CPU_COUNT(&set)) == libc::sysconf(libc::_SC_NPROCESSORS_ONLN)
                && libc::geteuid() == 0
        };
        // A reserved thread's children get the normal policy (the kernel refuses a deadline
        // task's fork otherwise); a batched one's inherit its policy.
        let expected = if everywhere {
            (SCHED_DEADLINE as libc::c_int, libc::SCHED_OTHER)
        } else {
            (libc::SCHED_BATCH, libc::SCHED_BATCH)
        };
        assert_eq!((own, child), expected);
    }
}
