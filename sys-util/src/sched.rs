//! Scheduling the threads that share the engine's cores: a background thread's CPU
//! reservation, and the CPUs a thread may run on.

use std::collections::BTreeSet;

/// The CPU a background thread (the sentinel's fit, a deep dive's writer, an attach) may take: 1 ms of
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
///
/// # A thread keeps it for its life
/// Threads take it once and end with it (fits, deep-dive writers, attaches). On this kind of
/// host (kernel 6.18) the daemon's loop thread, switched between SCHED_FIFO and this
/// reservation at every pass, was left throttled for good: state R, its deadline 20 minutes
/// past, never run (its pending SIGKILL included) until its policy was changed from outside.
pub const RESERVATION: Reservation = Reservation {
    runtime_ns: 1_000_000,
    period_ns: 10_000_000,
};

/// The CPU a heartbeat thread (the probes' lease keeper) may take: 100 µs of every 100 ms, a
/// thousandth of one CPU. It writes one word a second, and must write it on time whatever
/// saturates the CPUs: at the normal policy, beside a pipelined vLLM under load and a
/// SCHED_FIFO hog on 2 vCPUs, a 10 ms sleeper woke up to 17 s late (BENCHMARKS.md,
/// Reliability), and a lease not renewed for 30 s removes the engine's probes. Each keeper
/// holds its own; the kernel admits deadline tasks while their bandwidth fits its limit
/// (`/proc/sys/kernel/sched_rt_runtime_us`, 95 % of every CPU by default), which this one
/// barely touches.
pub const HEARTBEAT: Reservation = Reservation {
    runtime_ns: 100_000,
    period_ns: 100_000_000,
};

/// Where the kernel refuses the reservation: SCHED_BATCH (no preemption on wake-up) at this
/// nice value, which yields to the engine roughly 10:1 and may wait as long as above.
pub const FALLBACK_NICE: libc::c_int = 10;

/// `SCHED_DEADLINE` of include/uapi/linux/sched.h (libc does not name it).
pub const SCHED_DEADLINE: u32 = 6;

/// Whether `policy` is one of the fair class's (normal, batch, idle), below every real-time
/// and deadline one.
pub fn is_fair(policy: libc::c_int) -> bool {
    [libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_IDLE].contains(&policy)
}

/// A SCHED_DEADLINE reservation: `runtime_ns` of CPU in every `period_ns`.
pub struct Reservation {
    pub runtime_ns: u64,
    pub period_ns: u64,
}

/// Where [`background`] put the calling thread.
#[derive(Debug)]
pub enum Placed {
    /// At [`RESERVATION`].
    Reserved,
    /// At SCHED_BATCH nice [`FALLBACK_NICE`]; why the reservation was refused.
    Batched { refused: std::io::Error },
    /// Neither: it keeps its policy. Why each was refused.
    Unchanged {
        refused: std::io::Error,
        lowering: std::io::Error,
    },
}

/// Puts the calling thread in the background: [`RESERVATION`], or where the kernel refuses it
/// (no CAP_SYS_NICE; a CPU affinity narrower than the root domain, as in a cpuset-pinned
/// container; the CPUs' deadline bandwidth taken), SCHED_BATCH at [`FALLBACK_NICE`]. Threads
/// and processes it starts get the normal policy where it is reserved.
pub fn background() -> Placed {
    let Err(refused) = reserve(&RESERVATION) else {
        return Placed::Reserved;
    };
    let batch = set_policy(libc::SCHED_BATCH, 0);
    // SAFETY: plain syscalls on the calling thread (Linux nice values are per thread).
    let niced = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            FALLBACK_NICE,
        )
    } == 0;
    if batch && niced {
        Placed::Batched { refused }
    } else {
        Placed::Unchanged {
            refused,
            lowering: std::io::Error::last_os_error(),
        }
    }
}

/// Puts the calling thread at [`RESERVATION`] alone: where the kernel refuses it (see
/// [`background`]) the thread keeps its policy, for work that must not wait longer than at the
/// normal policy (an attach) rather than work that may (a fit).
pub fn reserved() -> std::io::Result<()> {
    reserve(&RESERVATION)
}

/// The calling thread at SCHED_DEADLINE with `r` (deadline = period); where the kernel refuses
/// it (see [`background`]) the thread keeps its policy. Threads and processes it starts get
/// the normal policy (SCHED_FLAG_RESET_ON_FORK; without it, the kernel refuses a deadline
/// task's fork). The kernel reserves only a thread that may run on every CPU of its root
/// domain: the thread is widened to every CPU its cpuset allows first, and narrowed back
/// where the reservation is refused.
pub fn reserve(r: &Reservation) -> std::io::Result<()> {
    let before = affinity(0);
    let _ = set_affinity(0, &(0..libc::CPU_SETSIZE as usize).collect());
    let reserved = deadline(r);
    if reserved.is_err() {
        if let Ok(before) = before {
            let _ = set_affinity(0, &before);
        }
    }
    reserved
}

fn deadline(r: &Reservation) -> std::io::Result<()> {
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

/// The CPUs thread `tid` may run on (0: the calling thread).
pub fn affinity(tid: libc::pid_t) -> std::io::Result<BTreeSet<usize>> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set, written by the kernel during the call.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid and writable for the size passed.
    if unsafe { libc::sched_getaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) }
        != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    Ok((0..libc::CPU_SETSIZE as usize)
        // SAFETY: CPU_ISSET reads inside the set for indices below CPU_SETSIZE.
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect())
}

/// Lets thread `tid` (0: the calling thread) run on `cpus` only (the kernel keeps those its
/// cpuset allows, and refuses a set with none of them).
pub fn set_affinity(tid: libc::pid_t, cpus: &BTreeSet<usize>) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus.iter().filter(|&&c| c < libc::CPU_SETSIZE as usize) {
        // SAFETY: CPU_SET writes inside the set for indices below CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    // SAFETY: `set` is a valid cpu_set_t of the size passed, read during the call only.
    if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets the calling thread's policy (`policy` may carry SCHED_RESET_ON_FORK) at `priority`.
pub fn set_policy(policy: libc::c_int, priority: libc::c_int) -> bool {
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
        let home = affinity(0).unwrap();
        let first = *home.iter().next().unwrap();
        let (own, child, cpus) = std::thread::spawn(move || {
            // Narrowed to one CPU, as the daemon keeps its threads off an engine's pinned
            // ones: the reservation widens it first.
            set_affinity(0, &BTreeSet::from([first])).unwrap();
            let _ = background();
            let child = std::thread::spawn(policy)
                .join()
                .expect("a thread started from it");
            (policy(), child, affinity(0).unwrap())
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
            (SCHED_DEADLINE as libc::c_int, libc::SCHED_OTHER, home)
        } else {
            (
                libc::SCHED_BATCH,
                libc::SCHED_BATCH,
                BTreeSet::from([first]),
            )
        };
        assert_eq!((own, child, cpus), expected);
    }
}
