//! A watchdog on the daemon's loop. The loop runs the sentinel of every engine; if it is held
//! up (by a capture's teardown, a slow /proc read, a lock), alerts stop coming without any
//! sign. The loop marks each phase it enters; a thread of its own checks that the mark moves
//! and logs a warning naming the phase, what the loop thread is doing (its state, kernel wait,
//! CPU, policy and CPU time) and what competes for the CPUs when it has not moved for
//! [`STUCK_AFTER`], again each time the hold-up doubles (a thread whose CPU time does not grow
//! is starved, one whose CPU time grows is busy), then how long it lasted once it is over.
//! The watchdog runs at the loop's real-time priority where the kernel grants it (it sleeps
//! between looks and reads a few /proc files), so that it reports on a node whose CPUs the
//! engine saturates.
//! The sleep between passes counts too once it outlasts its own length by [`STUCK_AFTER`]:
//! a loop thread that does not wake up is starved of CPU.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering},
        Arc,
    },
    thread::JoinHandle,
    time::Duration,
};

use log::warn;
use prometheus::{Histogram, HistogramVec};

use crate::os::{clock, sched::VerdictPriority};

/// A loop pass held up this long is reported.
pub const STUCK_AFTER: Duration = Duration::from_secs(3);

/// The parts of one pass of the daemon's loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Looking for engines to attach.
    Rescan = 0,
    /// Draining probe records and running the sentinel.
    Sentinel = 1,
    /// Feeding deep-dive captures and picking the next one.
    DeepDive = 2,
    /// Starting a capture (probes, samplers, the kernel plane's raw events).
    CaptureStart = 3,
    /// Stopping a capture and handing it to its writer.
    CaptureFinish = 4,
    /// Per-thread kernel accounting and exports.
    Accounting = 5,
    /// Sleeping between passes.
    Idle = 6,
    /// Leaving: the last capture, detaching the probes.
    Stopping = 7,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Rescan => "engine rescan",
            Phase::Sentinel => "sentinel (probe records)",
            Phase::DeepDive => "deep-dive scheduling",
            Phase::CaptureStart => "starting a capture",
            Phase::CaptureFinish => "stopping a capture",
            Phase::Accounting => "kernel accounting",
            Phase::Idle => "sleep between passes",
            Phase::Stopping => "stopping (detaching the probes)",
        }
    }

    /// Whether the phase runs at the verdict priority: every phase of a running daemon. The
    /// verdicts' path (waiting for an iteration's end, the sentinel, the per-pass look at the
    /// deep dives) needs it; the rest is the daemon's own bounded work (rescans, accounting,
    /// starting and stopping a capture: in-process reads, map updates, hooks attached, threads
    /// started or joined once they have finished; milliseconds), which at the normal policy a
    /// saturated node has held up for minutes, and every iteration that ended meanwhile waited
    /// for its verdict. What takes longer or much CPU runs on threads of its own at the
    /// normal policy (a capture's py-spy setup, its process-tree names, its writer). Only
    /// leaving, which detaches the probes and waits on the engine (remote calls through a
    /// helper process), runs at the normal policy.
    fn realtime(self) -> bool {
        !matches!(self, Phase::Stopping)
    }

    /// The phase's `phase` label in `stallscope_loop_phase_seconds`.
    fn label(self) -> &'static str {
        match self {
            Phase::Rescan => "rescan",
            Phase::Sentinel => "sentinel",
            Phase::DeepDive => "deep_dive",
            Phase::CaptureStart => "capture_start",
            Phase::CaptureFinish => "capture_finish",
            Phase::Accounting => "accounting",
            Phase::Idle => "idle",
            Phase::Stopping => "stopping",
        }
    }

    /// Every phase, in the order of its `u8` value (a test checks it).
    const ALL: [Phase; 8] = [
        Phase::Rescan,
        Phase::Sentinel,
        Phase::DeepDive,
        Phase::CaptureStart,
        Phase::CaptureFinish,
        Phase::Accounting,
        Phase::Idle,
        Phase::Stopping,
    ];

    fn from_u8(v: u8) -> Phase {
        Phase::ALL
            .get(usize::from(v))
            .copied()
            .unwrap_or(Phase::Idle)
    }
}

/// The loop's side: marks phases (two relaxed stores), times the phase it leaves (the sleep
/// between passes is not timed), and sets the loop thread's scheduling policy for the phase
/// (a syscall when it changes).
pub struct Marker {
    state: Arc<State>,
    priority: VerdictPriority,
    /// Each phase's histogram, indexed by `Phase as u8`.
    timing: Vec<Histogram>,
}

struct State {
    /// CLOCK_MONOTONIC ns of the last phase change (0: the loop has not started).
    since_ns: AtomicU64,
    phase: AtomicU8,
    /// The loop thread's tid, for its /proc state.
    tid: AtomicU64,
    stop: AtomicBool,
}

impl Marker {
    /// Records that the loop entered `phase` now.
    pub fn enter(&self, phase: Phase) {
        let now = clock::monotonic_ns();
        let left = self.state.phase.swap(phase as u8, Ordering::Relaxed);
        let since = self.state.since_ns.swap(now, Ordering::Relaxed);
        if since != 0 && left != Phase::Idle as u8 {
            self.timing[usize::from(left)].observe(now.saturating_sub(since) as f64 * 1e-9);
        }
        if phase.realtime() {
            self.priority.raise();
        } else {
            self.priority.lower();
        }
    }

    /// Whether the verdicts run at a real-time priority.
    pub fn realtime(&self) -> bool {
        self.priority.realtime()
    }
}

/// The watchdog thread; stopped and joined on drop.
pub struct Watchdog {
    state: Arc<State>,
    handle: Option<JoinHandle<()>>,
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Starts watching the calling thread's loop, which sleeps `idle` between passes.
///
/// Called on the loop thread: `priority` is that thread's from then on. Each phase's wall
/// time goes to `timing` (label `phase`).
pub fn start(
    idle: Duration,
    priority: u8,
    timing: &HistogramVec,
) -> std::io::Result<(Marker, Watchdog)> {
    let state = Arc::new(State {
        // 0 until the loop's first phase: the attaches before the loop are not a hold-up.
        since_ns: AtomicU64::new(0),
        phase: AtomicU8::new(Phase::Idle as u8),
        // SAFETY: gettid has no preconditions.
        tid: AtomicU64::new(unsafe { libc::gettid() } as u64),
        stop: AtomicBool::new(false),
    });
    let watched = state.clone();
    let handle = std::thread::Builder::new()
        .name("stallscope-watchdog".into())
        .spawn(move || {
            crate::os::sched::realtime(priority);
            watch(&watched, idle)
        })?;
    Ok((
        Marker {
            state: state.clone(),
            priority: VerdictPriority::new(priority),
            timing: Phase::ALL
                .iter()
                .map(|p| timing.with_label_values(&[p.label()]))
                .collect(),
        },
        Watchdog {
            state,
            handle: Some(handle),
        },
    ))
}

fn watch(s: &State, idle: Duration) {
    // The pass being reported as stuck: its start, and the hold-up that calls for the next report.
    let mut reported: Option<(u64, Duration)> = None;
    while !s.stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(500));
        let since = s.since_ns.load(Ordering::Relaxed);
        if since == 0 {
            continue;
        }
        let phase = Phase::from_u8(s.phase.load(Ordering::Relaxed));
        let held = Duration::from_nanos(clock::monotonic_ns().saturating_sub(since));
        let limit = match phase {
            Phase::Idle => STUCK_AFTER + idle,
            _ => STUCK_AFTER,
        };
        let next = match reported {
            Some((at, _)) if at != since => {
                warn!(
                    "the daemon's loop is moving again (held up {:.1?} in total)",
                    Duration::from_nanos(since.saturating_sub(at))
                );
                reported = None;
                continue;
            }
            Some((_, next)) => next,
            None => limit,
        };
        if held >= next {
            let tid = s.tid.load(Ordering::Relaxed);
            warn!(
                "the daemon's loop has been held up for {held:.1?} in {}: no alerts while it lasts (loop thread {tid}: {}{})",
                phase.name(),
                sys_util::task_state::doing(&format!("/proc/self/task/{tid}")),
                sys_util::task_state::cpu_contention()
            );
            reported = Some((since, held * 2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_phase_sits_at_its_own_value_in_the_list() {
        for (i, p) in Phase::ALL.iter().enumerate() {
            assert_eq!(*p as usize, i, "{p:?}");
            assert_eq!(Phase::from_u8(i as u8), *p);
        }
    }
}
