//! Scheduling of the daemon's own threads, which share the engine's cores: background threads
//! at a CPU reservation ([`sys_util::sched`]), the loop thread at a real-time priority while it
//! waits for verdicts.

use std::cell::Cell;

use log::{info, warn};
use sys_util::sched::{set_policy, Placed, FALLBACK_NICE};

/// Puts the calling thread in the background ([`sys_util::sched::background`]). The first
/// refusal of the reservation is logged once per daemon, with its reason.
pub fn background() {
    match sys_util::sched::background() {
        Placed::Reserved => {}
        Placed::Batched { refused } => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                info!(
                    "background threads (fits, deep-dive writers) run at SCHED_BATCH nice {FALLBACK_NICE}, with no bound on how long the engine's threads delay them: SCHED_DEADLINE was refused ({refused}; it needs CAP_SYS_NICE and a CPU affinity spanning every CPU)"
                );
            });
        }
        Placed::Unchanged { refused, lowering } => warn!(
            "cannot lower a background thread's priority: {lowering} (SCHED_DEADLINE was refused: {refused})"
        ),
    }
}

/// Puts the calling thread at the background reservation ([`sys_util::sched::reserved`]), or
/// leaves it at its policy where the kernel refuses it; the first refusal is logged once per
/// daemon, with its reason. For threads that must be served on a saturated node but not take
/// more than the reservation from it: attaches, the HTTP API.
pub fn reserved_or_normal() {
    if let Err(refused) = sys_util::sched::reserved() {
        static SAID: std::sync::Once = std::sync::Once::new();
        SAID.call_once(|| {
            info!(
                "attaches and the HTTP API run at the normal policy and may wait behind the engine's threads: SCHED_DEADLINE was refused ({refused}; it needs CAP_SYS_NICE and a CPU affinity spanning every CPU)"
            );
        });
    }
}

/// Puts the calling thread at SCHED_FIFO `priority` (0: leaves it as it is); whether it is.
/// Threads it starts get the normal policy (SCHED_RESET_ON_FORK).
pub fn realtime(priority: u8) -> bool {
    priority > 0
        && set_policy(
            libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK,
            priority.into(),
        )
}

/// The real-time priority of the daemon's loop thread while it waits for and makes verdicts.
///
/// An iteration's end wakes the loop (its engine's doorbell). Under the normal policy that
/// wake waits its turn behind whatever saturates the CPUs: with three spinning processes on
/// 2 vCPUs, a 50 ms sleeper's wake came 3.6 ms late at p99, 7.9 ms when a nice-10 thread of
/// its own session burned CPU beside it (autogroup charges a session's threads to one
/// scheduling entity, so the daemon's own fits and deep-dive writers delay its loop), and
/// 0.10 ms under SCHED_FIFO (200 sleeps each). The thread is SCHED_FIFO in the phases of its
/// loop on the verdicts' path (the wait, the engines' verdicts, a look at the deep dives:
/// microseconds per iteration) and in its own bounded work (rescans, per-thread accounting,
/// starting and stopping a capture: milliseconds, which at the normal policy beside a
/// saturated vLLM on 2 vCPUs wait in the run queue many times as long as they run), so it
/// takes no more CPU from the engine than before, only sooner; what takes tens of ms of CPU
/// runs on threads of its own at the normal policy. It drops to the normal policy to detach
/// when the daemon stops, which waits on the engine (remote calls through a helper process).
/// Not to the background reservation: a thread switching between SCHED_FIFO and
/// SCHED_DEADLINE there was once left throttled for good
/// ([`sys_util::sched::RESERVATION`]). The kernel's RT throttling (`sched_rt_runtime_us`)
/// bounds what a runaway loop could take.
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
        if realtime(priority as u8) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The calling thread's policy.
    fn policy() -> libc::c_int {
        // SAFETY: pid 0 is the calling thread.
        unsafe { libc::sched_getscheduler(0) & !libc::SCHED_RESET_ON_FORK }
    }

    #[test]
    fn the_loop_thread_alternates_between_fifo_and_the_normal_policy() {
        std::thread::spawn(|| {
            let p = VerdictPriority::new(1);
            if !p.realtime() {
                // Without CAP_SYS_NICE: the normal policy throughout.
                p.lower();
                assert_eq!(policy(), libc::SCHED_OTHER);
                return;
            }
            for _ in 0..3 {
                assert_eq!(policy(), libc::SCHED_FIFO);
                // What the loop starts runs at the normal policy.
                let child = std::thread::spawn(policy).join().unwrap();
                assert_eq!(child, libc::SCHED_OTHER);
                p.lower();
                assert_eq!(policy(), libc::SCHED_OTHER);
                p.raise();
            }
        })
        .join()
        .unwrap();
    }
}
