//! Keeping the daemon's threads off the CPUs a watched engine pins its compute threads to.
//!
//! An engine that pins threads runs its forward pass on them: vLLM on CPU binds each OpenMP
//! thread of its worker to a CPU of its own and leaves a CPU to its engine core and front end
//! (`VLLM_CPU_OMP_THREADS_BIND`, one CPU reserved by default). A daemon thread woken on such a
//! CPU preempts the forward pass, and an OpenMP team waits for its slowest member at every
//! barrier, so each wake there costs the whole step. The scheduler wakes a thread where it
//! last ran, so where the daemon's threads land is chance: one daemon's loop thread was on
//! the worker's CPU in every sample, another's on the other CPU. Off those CPUs the daemon
//! shares the engine core's, which waits for its worker in a `sched_yield` spin that hands
//! the CPU over at once. Beside vLLM on 2 vCPUs this took the worker's involuntary switches
//! from 307 to 268 a second and the daemon's CPU from 0.36 to 0.29 % of a core; the worker's
//! run-queue wait did not change measurably (BENCHMARKS.md, Sentinel).
//!
//! A thread counts as pinned when its affinity is narrower than the union of every watched
//! thread's: a container's cpuset narrows all of them alike and pins none. Where the pinned
//! CPUs are all the daemon may use, it stays where it is.
//!
//! Threads reserved with SCHED_DEADLINE (fits, deep-dive writers, attaches, the HTTP API, the
//! probes' lease keeper) keep every CPU: the kernel refuses a deadline thread an affinity
//! narrower than its root domain (`sched_setaffinity` answers EBUSY, `__sched_setscheduler`
//! EPERM; kernel/sched/syscalls.c), and their reservation bounds what they take from any CPU
//! (1 ms in 10 at most).

use std::{
    collections::BTreeSet,
    time::{Duration, Instant},
};

use log::info;
use sys_util::sched::{affinity, set_affinity};

use super::procfs;

/// How often the watched threads' affinities are read again when the watched set is
/// unchanged: an engine binds its threads after it starts (vLLM's worker, once its model is
/// loaded).
const RECHECK: Duration = Duration::from_secs(30);

/// Where the daemon's threads may run, following the watched processes' pinned threads.
pub struct Placement {
    /// The CPUs the daemon was started on.
    home: BTreeSet<usize>,
    /// The CPUs its threads are kept off now.
    kept_off: BTreeSet<usize>,
    /// The processes and time of the last look.
    looked: Option<(BTreeSet<u32>, Instant)>,
}

impl Placement {
    /// The daemon's CPUs as it starts; `None` where they cannot be read.
    pub fn new() -> Option<Self> {
        Some(Self {
            home: affinity(0).ok()?,
            kept_off: BTreeSet::new(),
            looked: None,
        })
    }

    /// The CPUs the daemon's threads are kept off.
    pub fn kept_off(&self) -> &BTreeSet<usize> {
        &self.kept_off
    }

    /// Looks at `watched`'s threads when they changed or [`RECHECK`] passed, and moves every
    /// thread of the daemon off the CPUs they pin (or back, when none do any longer). Threads
    /// started since the last look from a deadline-reserved one (which keeps every CPU) are
    /// moved then too.
    pub fn follow(&mut self, watched: &BTreeSet<u32>) {
        if self
            .looked
            .as_ref()
            .is_some_and(|(pids, at)| pids == watched && at.elapsed() < RECHECK)
        {
            return;
        }
        self.looked = Some((watched.clone(), Instant::now()));
        let pinned = pinned_cpus(watched);
        let mut off: BTreeSet<usize> = self.home.intersection(&pinned).copied().collect();
        if off.len() == self.home.len() {
            off.clear();
        }
        if off.is_empty() && self.kept_off.is_empty() {
            return;
        }
        let to: BTreeSet<usize> = self.home.difference(&off).copied().collect();
        let moved = threads_of(std::process::id())
            .filter(|&tid| affinity(tid).is_ok_and(|now| now != to))
            .filter(|&tid| set_affinity(tid, &to).is_ok())
            .count();
        if off == self.kept_off {
            return;
        }
        if off.is_empty() {
            info!("the daemon's threads may run on every CPU it started on again ({moved} moved)");
        } else {
            info!(
                "the daemon's threads keep off CPUs {off:?}, where a watched engine pins its threads, and run on {to:?} ({moved} moved; deadline-reserved ones keep every CPU)"
            );
        }
        self.kept_off = off;
    }
}

/// The CPUs some thread of `pids` is pinned to: those of each thread whose affinity is
/// narrower than the union of all their threads'.
fn pinned_cpus(pids: &BTreeSet<u32>) -> BTreeSet<usize> {
    let masks: Vec<BTreeSet<usize>> = pids
        .iter()
        .flat_map(|&pid| threads_of(pid))
        .filter_map(|tid| affinity(tid).ok())
        .collect();
    let all: BTreeSet<usize> = masks.iter().flatten().copied().collect();
    masks
        .iter()
        .filter(|m| m.len() < all.len())
        .flatten()
        .copied()
        .collect()
}

/// The thread ids of `pid` as the scheduler calls take them.
fn threads_of(pid: u32) -> impl Iterator<Item = libc::pid_t> {
    procfs::threads(pid)
        .into_iter()
        .filter_map(|t| libc::pid_t::try_from(t).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process with one thread pinned to the first CPU: the daemon's threads (this test's)
    /// keep off it, and move back when the process is no longer watched.
    #[test]
    fn keeps_off_a_watched_threads_pinned_cpu_and_back() {
        let home = affinity(0).unwrap();
        if home.len() < 2 {
            eprintln!("skipped: this process may run on one CPU only ({home:?})");
            return;
        }
        let first = *home.iter().next().unwrap();
        let mut engine = std::process::Command::new("python3")
            .args([
                "-c",
                &format!(
                    "import os, threading, time\n\
                     def pinned():\n    os.sched_setaffinity(0, {{{first}}})\n    time.sleep(60)\n\
                     threading.Thread(target=pinned, daemon=True).start()\n\
                     print('ready', flush=True)\ntime.sleep(60)"
                ),
            ])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(engine.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let mut p = Placement::new().unwrap();
        let watched = BTreeSet::from([engine.id()]);
        p.follow(&watched);
        let rest: BTreeSet<usize> = home.iter().copied().filter(|&c| c != first).collect();
        assert_eq!(p.kept_off(), &BTreeSet::from([first]));
        assert_eq!(
            affinity(0).unwrap(),
            rest,
            "this thread moved off CPU {first}"
        );
        let _ = engine.kill();
        let _ = engine.wait();
        p.looked = None;
        p.follow(&BTreeSet::new());
        assert!(p.kept_off().is_empty());
        assert_eq!(affinity(0).unwrap(), home, "and back");
    }
}
