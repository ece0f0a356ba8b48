//! Per-thread spans from a capture's raw kernel events: scheduler states (running,
//! runnable, yielded, sleeping, blocked) and syscalls, in time order, without overlaps.

use std::collections::{BTreeMap, HashMap};

use probe_common::event;

use super::capture::Collected;

/// Scheduler state of a thread over a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// On a CPU.
    Running,
    /// Ready, waiting for a CPU (woken or preempted).
    Runnable,
    /// Ready, waiting for a CPU it gave away itself (`sched_yield`): a spin-wait for another
    /// thread, not contention.
    Yielded,
    /// Interruptible sleep (waiting for an event).
    Sleeping,
    /// Uninterruptible sleep (disk I/O, page faults, reclaim).
    Blocked,
}

impl State {
    /// Name used in traces and reports.
    pub fn name(self) -> &'static str {
        match self {
            State::Running => "running",
            State::Runnable => "runnable",
            State::Yielded => "yielded",
            State::Sleeping => "sleeping",
            State::Blocked => "blocked (D)",
        }
    }
}

/// A closed interval on one thread.
#[derive(Debug, Clone)]
pub struct Span<T> {
    /// Start, ns.
    pub start: u64,
    /// End, ns.
    pub end: u64,
    /// What.
    pub what: T,
}

/// A syscall span: one call, or a run of `sched_yield` calls that the probes streamed as one
/// ([`event::YIELDS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Syscall {
    /// Syscall number.
    pub nr: u32,
    /// Calls the span holds: 1, more for a run of `sched_yield`, 0 when the capture ended
    /// before the span did.
    pub calls: u64,
}

/// Per-thread spans derived from the kernel events.
#[derive(Debug, Default)]
pub struct Timeline {
    /// Thread states, per thread in time order, non-overlapping.
    pub states: BTreeMap<u32, Vec<Span<State>>>,
    /// Syscalls, per thread in time order, non-overlapping.
    pub syscalls: BTreeMap<u32, Vec<Span<Syscall>>>,
}

/// Closes `tid`'s current state at `ts` and starts `next` (if any).
fn set(
    t: &mut Timeline,
    current: &mut HashMap<u32, (State, u64)>,
    tid: u32,
    ts: u64,
    next: Option<State>,
) {
    if let Some((s, since)) = current.remove(&tid) {
        if ts > since {
            t.states.entry(tid).or_default().push(Span {
                start: since,
                end: ts,
                what: s,
            });
        }
    }
    if let Some(n) = next {
        current.insert(tid, (n, ts));
    }
}

/// Records `tid`'s syscall `(nr, start)`, open since `start`, as ended at `end` after `calls`
/// calls.
fn end_syscall(t: &mut Timeline, tid: u32, (nr, start): (u32, u64), end: u64, calls: u64) {
    t.syscalls.entry(tid).or_default().push(Span {
        start,
        end,
        what: Syscall { nr, calls },
    });
}

/// TASK_UNINTERRUPTIBLE in sched_switch's prev_state.
pub const TASK_UNINTERRUPTIBLE: u64 = 0x2;

impl Timeline {
    /// Builds the spans of the captured threads. Intervals that began before the capture
    /// start at the first event that shows them; those still open at the end close there.
    pub fn build(c: &Collected) -> Timeline {
        let mut events = c.kernel.clone();
        events.sort_by_key(|e| e.ts_ns);
        let ours = |tid: u32| c.threads.contains_key(&tid);
        let mut t = Timeline::default();
        let mut current: HashMap<u32, (State, u64)> = HashMap::new();
        let mut open_sys: HashMap<u32, (u32, u64)> = HashMap::new();
        for e in events.iter().filter(|e| e.ts_ns <= c.end_ns) {
            let ts = e.ts_ns;
            match u32::from(e.kind) {
                event::SWITCH => {
                    let next_tid = e.arg0 as u32;
                    if ours(e.tid) {
                        let prev_state = e.arg1 & 0xffff_ffff;
                        let preempt = e.arg1 >> 32 != 0;
                        // Still TASK_RUNNING: preempted (in user mode the tracepoint's
                        // preempt flag is false too), or giving the CPU away in sched_yield.
                        let yielding = open_sys
                            .get(&e.tid)
                            .is_some_and(|(nr, _)| i64::from(*nr) == libc::SYS_sched_yield);
                        let s = if prev_state == 0 && !preempt && yielding {
                            State::Yielded
                        } else if preempt || prev_state == 0 {
                            State::Runnable
                        } else if prev_state & TASK_UNINTERRUPTIBLE != 0 {
                            State::Blocked
                        } else {
                            State::Sleeping
                        };
                        set(&mut t, &mut current, e.tid, ts, Some(s));
                    }
                    if ours(next_tid) {
                        set(&mut t, &mut current, next_tid, ts, Some(State::Running));
                    }
                }
                event::WAKEUP if ours(e.tid) => {
                    let asleep = current
                        .get(&e.tid)
                        .is_none_or(|(s, _)| matches!(s, State::Sleeping | State::Blocked));
                    if asleep {
                        set(&mut t, &mut current, e.tid, ts, Some(State::Runnable));
                    }
                }
                event::EXIT if ours(e.tid) => {
                    set(&mut t, &mut current, e.tid, ts, None);
                    // The exit (or exit_group) it was in never returns: it ends here, with
                    // the thread, not at the end of the capture.
                    if let Some(open) = open_sys.remove(&e.tid) {
                        end_syscall(&mut t, e.tid, open, ts, 1);
                    }
                }
                event::SYS_ENTER if ours(e.tid) => {
                    open_sys.insert(e.tid, (e.arg0 as u32, ts));
                }
                kind @ (event::SYS_EXIT | event::YIELDS) if ours(e.tid) => {
                    if let Some(open) = open_sys.remove(&e.tid) {
                        if open.0 == e.arg0 as u32 {
                            let calls = if kind == event::YIELDS { e.arg1 } else { 1 };
                            end_syscall(&mut t, e.tid, open, ts, calls);
                        }
                    }
                }
                _ => {}
            }
        }
        let tids: Vec<u32> = current.keys().copied().collect();
        for tid in tids {
            set(&mut t, &mut current, tid, c.end_ns, None);
        }
        for (tid, open) in open_sys {
            if c.end_ns > open.1 {
                end_syscall(&mut t, tid, open, c.end_ns, 0);
            }
        }
        for v in t.syscalls.values_mut() {
            v.sort_by_key(|s| s.start);
        }
        t
    }
}
