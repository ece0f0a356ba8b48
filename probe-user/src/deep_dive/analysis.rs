//! From raw capture to spans (thread states, syscalls, Python calls), iteration cycles, and
//! the root-cause ranking of the deep-dive window against the normal reference window.

use std::collections::{BTreeMap, HashMap};

use model::root_cause::{self, Cycle, EventKey, EventKind, SeriesShift, Suspect};
use probe_common::event;
use pyframe_tracer::session::Call;
use serde::Serialize;

use super::capture::Collected;
use crate::syscall_names;

/// Scheduler state of a thread over a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum State {
    /// On a CPU.
    Running,
    /// Ready, waiting for a CPU (woken or preempted).
    Runnable,
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

/// Per-thread spans derived from the kernel events.
#[derive(Debug, Default)]
pub struct Timeline {
    /// Thread states, per thread in time order, non-overlapping.
    pub states: BTreeMap<u32, Vec<Span<State>>>,
    /// Syscalls, per thread in time order, non-overlapping (syscall number).
    pub syscalls: BTreeMap<u32, Vec<Span<u32>>>,
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

/// TASK_UNINTERRUPTIBLE in sched_switch's prev_state.
const TASK_UNINTERRUPTIBLE: u64 = 0x2;

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
                        let s = if preempt || prev_state == 0 {
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
                event::EXIT if ours(e.tid) => set(&mut t, &mut current, e.tid, ts, None),
                event::SYS_ENTER if ours(e.tid) => {
                    open_sys.insert(e.tid, (e.arg0 as u32, ts));
                }
                event::SYS_EXIT if ours(e.tid) => {
                    if let Some((nr, start)) = open_sys.remove(&e.tid) {
                        if nr == e.arg0 as u32 {
                            t.syscalls.entry(e.tid).or_default().push(Span {
                                start,
                                end: ts,
                                what: nr,
                            });
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
        for (tid, (nr, start)) in open_sys {
            if c.end_ns > start {
                t.syscalls.entry(tid).or_default().push(Span {
                    start,
                    end: c.end_ns,
                    what: nr,
                });
            }
        }
        for v in t.syscalls.values_mut() {
            v.sort_by_key(|s| s.start);
        }
        t
    }
}

/// One iteration cycle.
#[derive(Debug, Clone)]
pub struct CycleSpan {
    /// Start, ns.
    pub start: u64,
    /// End, ns.
    pub end: u64,
    /// Thread that ran it (0 for fixed time bins).
    pub tid: u32,
    /// Workload fields of the anchor call.
    pub args: BTreeMap<String, i64>,
}

/// How cycles were found.
#[derive(Debug, Clone, Serialize)]
pub struct CycleSource {
    /// The anchor function, or `fixed 100 ms bins` when no iteration-like function was seen.
    pub anchor: String,
    /// Cycles in the normal reference.
    pub normal: usize,
    /// Cycles in the deep-dive window.
    pub anomalous: usize,
    /// Where the normal reference came from.
    pub reference: String,
}

/// A normal reference: the features of healthy cycles of the same process, from a window
/// recorded before the deep dive (`--baseline`) or kept by the daemon (its rolling reference).
#[derive(Debug, Clone, Default)]
pub struct Reference {
    /// Features of each normal cycle.
    pub cycles: Vec<Cycle>,
    /// Mean normal cycle, ms.
    pub mean_cycle_ms: f64,
    /// Where it came from, for the report.
    pub source: String,
}

impl Reference {
    /// The reference made of the cycles of `c` inside [from, to) (and inside the kernel
    /// events' complete part, [`Collected::kernel_complete_until`]).
    pub fn from_window(
        c: &Collected,
        timeline: &Timeline,
        from: u64,
        to: u64,
        source: String,
    ) -> Reference {
        let anchor = anchor(c);
        let calls: &[Call] = c.python.as_ref().map_or(&[], |p| &p.calls);
        let spans = cycles(
            calls,
            anchor.as_deref(),
            from,
            to.min(c.kernel_complete_until()),
        );
        Reference {
            cycles: features(c, timeline, &spans, anchor.as_deref()),
            mean_cycle_ms: mean_ms(&spans),
            source,
        }
    }
}

/// Mean duration of `v`, ms (0 when empty).
fn mean_ms(v: &[CycleSpan]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().map(|c| (c.end - c.start) as f64).sum::<f64>() / v.len() as f64 / 1e6
    }
}

/// Fixed bins used when no anchor exists (not a Python engine, or an idle one).
const BIN_NS: u64 = 100_000_000;

/// The iteration cycles of [from, to): calls of `anchor`, or fixed bins.
pub fn cycles(calls: &[Call], anchor: Option<&str>, from: u64, to: u64) -> Vec<CycleSpan> {
    if let Some(a) = anchor {
        let mut v: Vec<CycleSpan> = calls
            .iter()
            .filter(|c| c.func == a && c.start_ns >= from && c.end_ns <= to)
            .map(|c| CycleSpan {
                start: c.start_ns,
                end: c.end_ns,
                tid: c.tid as u32,
                args: c.args.clone(),
            })
            .collect();
        v.sort_by_key(|c| c.start);
        return v;
    }
    (from..to)
        .step_by(BIN_NS as usize)
        .map(|s| CycleSpan {
            start: s,
            end: (s + BIN_NS).min(to),
            tid: 0,
            args: BTreeMap::new(),
        })
        .filter(|c| c.end > c.start)
        .collect()
}

/// The anchor of the capture: the profile's, or discovered from call statistics.
pub fn anchor(c: &Collected) -> Option<String> {
    let py = c.python.as_ref()?;
    if let Some(p) = py.probes.iter().find(|p| p.role == "anchor") {
        return Some(p.func().to_string());
    }
    let mut by_func: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for call in &py.calls {
        by_func
            .entry(&call.func)
            .or_default()
            .push(call.end_ns.saturating_sub(call.start_ns));
    }
    let stats: Vec<model::anchor::CallStats> = by_func
        .iter()
        .map(|(f, d)| model::anchor::CallStats::from_durations(f, d))
        .collect();
    model::anchor::discover(&stats, 20, 500_000.0).map(|i| stats[i].func.clone())
}

fn overlap(a0: u64, a1: u64, b0: u64, b1: u64) -> u64 {
    a1.min(b1).saturating_sub(a0.max(b0))
}

/// Spans of one thread (sorted, non-overlapping) that overlap [s, e).
fn overlapping<T>(spans: &[Span<T>], s: u64, e: u64) -> impl Iterator<Item = &Span<T>> {
    let first = spans.partition_point(|x| x.end <= s);
    spans[first..].iter().take_while(move |x| x.start < e)
}

/// The features of every cycle: time shares of thread states (by thread name), syscalls
/// and Python functions, and mean telemetry.
pub fn features(
    c: &Collected,
    timeline: &Timeline,
    cycles: &[CycleSpan],
    anchor: Option<&str>,
) -> Vec<Cycle> {
    let calls: &[Call] = c.python.as_ref().map_or(&[], |p| &p.calls);
    let comm = |tid: u32| c.threads.get(&tid).map_or("?", |t| t.comm.as_str());
    cycles
        .iter()
        .map(|cy| {
            let len = cy.end.saturating_sub(cy.start).max(1) as f64;
            let mut shares: BTreeMap<EventKey, f64> = BTreeMap::new();
            let mut add = |kind, name: String, ns: u64| {
                if ns > 0 {
                    *shares.entry(EventKey { kind, name }).or_default() += ns as f64 / len;
                }
            };
            for (tid, spans) in &timeline.states {
                // Interruptible sleep is always inside a syscall (futex, epoll_wait, read...),
                // which is already an event of its own; as a thread state it only mirrors what
                // the thread waits for (a worker idles while its starved engine core runs
                // late), so it is left out of the ranking. The trace still shows it.
                for s in overlapping(spans, cy.start, cy.end).filter(|s| s.what != State::Sleeping)
                {
                    let ns = overlap(s.start, s.end, cy.start, cy.end);
                    add(
                        EventKind::ThreadState,
                        format!("{} {}", s.what.name(), comm(*tid)),
                        ns,
                    );
                }
            }
            for spans in timeline.syscalls.values() {
                for s in overlapping(spans, cy.start, cy.end) {
                    let name = syscall_names::name(s.what);
                    if HANDOFF_SYSCALLS.contains(&name.as_str()) {
                        continue;
                    }
                    let ns = overlap(s.start, s.end, cy.start, cy.end);
                    add(EventKind::Syscall, name, ns);
                }
            }
            for call in calls.iter().filter(|k| Some(k.func.as_str()) != anchor) {
                let ns = overlap(call.start_ns, call.end_ns, cy.start, cy.end);
                add(EventKind::Python, call.func.clone(), ns);
            }
            let utilisation = c
                .telemetry
                .series
                .iter()
                .filter(|(_, s)| s.unit == "%" || s.unit == "/s")
                .filter_map(|(name, s)| {
                    // A cycle shorter than the sampling period takes the next sample.
                    c.telemetry
                        .mean(name, cy.start, cy.end)
                        .or_else(|| {
                            let i = s.points.partition_point(|p| p.0 < cy.end);
                            s.points.get(i).map(|p| p.1)
                        })
                        .map(|m| (name.clone(), m))
                })
                .collect();
            Cycle {
                shares,
                utilisation,
            }
        })
        .collect()
}

/// Syscalls in which a thread waits for another thread of the engine (locks, condition
/// variables, spin-and-yield hand-offs). Their time grows with whatever delays the other
/// thread: vLLM's engine core spends each step in futex and sched_yield waiting for its worker,
/// so when memory pressure or a hog slows the worker they grow most and would name the
/// symptom, not the cause. Like interruptible sleep they are left out of the ranking (the
/// trace still shows them).
const HANDOFF_SYSCALLS: [&str; 2] = ["futex", "sched_yield"];

/// Syscalls that wait on storage.
const IO_SYSCALLS: [&str; 14] = [
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "openat",
    "close",
    "io_uring_enter",
    "io_getevents",
    "sync",
];
/// Syscalls that manage memory.
const MEMORY_SYSCALLS: [&str; 6] = ["mmap", "munmap", "brk", "madvise", "mprotect", "mremap"];

/// The telemetry series an event depends on.
pub fn resources(e: &EventKey) -> Vec<String> {
    let v: &[&str] = match e.kind {
        EventKind::ThreadState
            if e.name.starts_with("running") || e.name.starts_with("runnable") =>
        {
            &["psi.cpu.some", "cpu.util"]
        }
        EventKind::ThreadState if e.name.starts_with("blocked") => &[
            "psi.memory.some",
            "psi.memory.full",
            "psi.io.some",
            "psi.io.full",
            "vm.pgmajfault",
        ],
        EventKind::Syscall if IO_SYSCALLS.contains(&e.name.as_str()) => {
            &["psi.io.some", "psi.io.full"]
        }
        EventKind::Syscall if MEMORY_SYSCALLS.contains(&e.name.as_str()) => {
            &["psi.memory.some", "psi.memory.full"]
        }
        _ => &[],
    };
    v.iter().map(|s| s.to_string()).collect()
}

/// The root-cause report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Suspects, best first.
    pub suspects: Vec<Suspect>,
    /// Telemetry shifts, largest first.
    pub telemetry: Vec<SeriesShift>,
    /// How cycles were found and how many each window has.
    pub cycles: CycleSource,
    /// Mean cycle duration in each window, ms.
    pub normal_cycle_ms: f64,
    /// Mean cycle duration in the deep-dive window, ms.
    pub anomalous_cycle_ms: f64,
    /// The most likely cause's category (`CPU contention`, `memory pressure`, `I/O
    /// contention`, or the top event), None when nothing stands out.
    pub category: Option<String>,
    /// The most likely cause in a few words.
    pub summary: String,
}

/// Category of a suspect from its resource (or its kind).
pub fn category(s: &Suspect) -> String {
    match s.resource.as_deref() {
        Some(r) if r.starts_with("psi.cpu") || r.starts_with("cpu") => "CPU contention".into(),
        Some(r) if r.starts_with("psi.memory") || r.starts_with("vm.") => "memory pressure".into(),
        Some(r) if r.starts_with("psi.io") => "I/O contention".into(),
        _ => match s.kind {
            EventKind::Python => format!("slower Python function {}", s.name),
            EventKind::Syscall => format!("longer syscall {}", s.name),
            EventKind::ThreadState => format!("thread state {}", s.name),
        },
    }
}

/// |Z_β| below which the top suspect is reported as no real change.
const SIGNIFICANT_Z: f64 = 2.0;

/// Ranks the cycles of `c` in [from, end) against `reference` (end: where its kernel events
/// stop being complete, [`Collected::kernel_complete_until`]).
pub fn root_cause(c: &Collected, timeline: &Timeline, reference: &Reference, from: u64) -> Report {
    let anchor = anchor(c);
    let calls: &[Call] = c.python.as_ref().map_or(&[], |p| &p.calls);
    let anomalous = cycles(calls, anchor.as_deref(), from, c.kernel_complete_until());
    let fa = features(c, timeline, &anomalous, anchor.as_deref());
    let (suspects, telemetry) = root_cause::rank(&reference.cycles, &fa, resources);
    let significant = suspects
        .first()
        .filter(|s| s.delta_beta > 0.0 && s.z_beta.abs() >= SIGNIFICANT_Z);
    let summary = match suspects.first() {
        None => format!(
            "nothing to compare: {} normal and {} deep-dive cycles ({}; record a normal window with --baseline)",
            reference.cycles.len(),
            anomalous.len(),
            reference.source
        ),
        Some(s) if s.delta_beta <= 0.0 || s.z_beta.abs() < SIGNIFICANT_Z => format!(
            "no event stands out against the normal reference (largest shift: {} {:+.1} % of the cycle, Z {:.1})",
            s.name,
            100.0 * s.delta_beta,
            s.z_beta
        ),
        Some(s) => format!(
            "most likely {}: {} {} took {:.1} % of each cycle instead of {:.1} % (Z {:.1}){}",
            category(s),
            match s.kind {
                EventKind::ThreadState => "thread state",
                EventKind::Syscall => "syscall",
                EventKind::Python => "Python function",
            },
            s.name,
            100.0 * s.anomalous_beta,
            100.0 * s.normal_beta,
            s.z_beta,
            s.resource
                .as_ref()
                .map(|r| format!(", {r} Z {:.1}", s.z_mu))
                .unwrap_or_default()
        ),
    };
    Report {
        cycles: CycleSource {
            anchor: anchor.unwrap_or_else(|| "fixed 100 ms bins".into()),
            normal: reference.cycles.len(),
            anomalous: anomalous.len(),
            reference: reference.source.clone(),
        },
        normal_cycle_ms: reference.mean_cycle_ms,
        category: significant.map(category),
        anomalous_cycle_ms: mean_ms(&anomalous),
        suspects,
        telemetry,
        summary,
    }
}
