//! From a capture's spans (see [`super::timeline`]) to iteration cycles, and the root-cause
//! ranking of the deep-dive window against the normal reference window.

use std::collections::{BTreeMap, BTreeSet};

use model::root_cause::{self, Cycle, EventKey, EventKind, SeriesShift, Suspect};
use pyframe_tracer::session::Call;
use serde::Serialize;

use super::{
    capture::Collected,
    cycles::{anchor, anomalous_cycles, cycles, mean_ms, CycleSpan},
    resources::{resources, WAIT_SYSCALLS},
    timeline::{Span, State, Timeline},
};
use crate::kernel_plane::syscall_names;

/// Every state, for parsing event names back.
const STATES: [State; 5] = [
    State::Running,
    State::Runnable,
    State::Yielded,
    State::Sleeping,
    State::Blocked,
];

/// The ranking's name of `state` on threads named `comm`: `runnable VLLM::Worker`.
fn state_event(state: State, comm: &str) -> String {
    format!("{} {comm}", state.name())
}

/// The state and thread name of a [`state_event`] name.
fn parse_state_event(name: &str) -> Option<(State, &str)> {
    STATES.iter().find_map(|s| {
        name.strip_prefix(s.name())
            .and_then(|rest| rest.strip_prefix(' '))
            .map(|comm| (*s, comm))
    })
}

/// The state and thread name of a ranking event, if it is a thread state.
fn thread_state(k: &EventKey) -> Option<(State, &str)> {
    if k.kind == EventKind::ThreadState {
        parse_state_event(&k.name)
    } else {
        None
    }
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
    /// The deep-dive window was cut into 100 ms bins: no iteration completed inside it (an
    /// iteration stalled longer than the window).
    pub anomalous_binned: bool,
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
                // late), so it is left out of the ranking. So is the run-queue wait after a
                // sched_yield: vLLM's engine core spins in sched_yield while its worker runs,
                // and that wait grows with anything that slows the worker (memory pressure
                // ranked as "runnable" CPU contention). The trace still shows both.
                for s in overlapping(spans, cy.start, cy.end)
                    .filter(|s| !matches!(s.what, State::Sleeping | State::Yielded))
                {
                    let ns = overlap(s.start, s.end, cy.start, cy.end);
                    add(EventKind::ThreadState, state_event(s.what, comm(*tid)), ns);
                }
            }
            for spans in timeline.syscalls.values() {
                for s in overlapping(spans, cy.start, cy.end) {
                    let name = syscall_names::name(s.what.nr);
                    if WAIT_SYSCALLS.contains(&name.as_str()) {
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

/// The root-cause report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// Suspects, best first.
    pub suspects: Vec<Suspect>,
    /// The threads (by name) whose states were ranked: those running at least 5 % of the
    /// normal cycle.
    pub ranked_threads: Vec<String>,
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

/// Memory series whose rise means reclaim is taking the engine's pages.
const RECLAIM_SERIES: [&str; 3] = ["vm.pgmajfault", "psi.memory.some", "psi.memory.full"];

/// Category of a suspect from its resource (or its kind). Blocked (D) time is the engine
/// reading pages back (its file-backed pages, taken by reclaim) or waiting on the disk: it is
/// memory pressure when memory ran short (`mem.used` up by [`SIGNIFICANT_Z`]; without that
/// series, when major faults or PSI memory rose), and I/O contention when memory did not
/// while the disk was saturated: PSI io rose in both `some` and `full` (at times every task
/// that could run waited on I/O), or the ranking tied the blocked time to PSI io itself. Then
/// the pages come back slowly because the disk is busy, not because memory is short. Refaults
/// served by an idle disk raise `psi.io.some` a little but hardly `full` (measured on vLLM:
/// under memory pressure `full` rose by Z <= 2.3 where `some` did, under fsync-heavy writers
/// by Z >= 2.2 with `some` >= 4.1; docs/evaluation/seed6-intel).
pub fn category(s: &Suspect, telemetry: &[SeriesShift]) -> String {
    let rose = |names: &[&str]| {
        telemetry
            .iter()
            .any(|t| names.contains(&t.name.as_str()) && t.z >= SIGNIFICANT_Z)
    };
    let memory_short = || {
        if telemetry.iter().any(|t| t.name == "mem.used") {
            rose(&["mem.used"])
        } else {
            rose(&RECLAIM_SERIES)
        }
    };
    let storage =
        |r: &str| r.starts_with("psi.memory") || r.starts_with("vm.") || r.starts_with("psi.io");
    match s.resource.as_deref() {
        Some(r) if r.starts_with("psi.cpu") || r.starts_with("cpu") => "CPU contention".into(),
        Some(r) if s.kind == EventKind::ThreadState && storage(r) => {
            if memory_short() {
                "memory pressure".into()
            } else if (rose(&["psi.io.some"]) && rose(&["psi.io.full"])) || r.starts_with("psi.io")
            {
                "I/O contention".into()
            } else {
                "memory pressure".into()
            }
        }
        Some(r) if r.starts_with("psi.memory") || r.starts_with("vm.") => "memory pressure".into(),
        Some(r) if r.starts_with("psi.io") => "I/O contention".into(),
        _ => match s.kind {
            EventKind::Python => format!("slower Python function {}", s.name),
            EventKind::Syscall => format!("longer syscall {}", s.name),
            EventKind::ThreadState => format!("thread state {}", s.name),
        },
    }
}

/// The category a report names: the best suspect's ([`category`]) when its share grew by at
/// least [`SIGNIFICANT_Z`], None when nothing stands out. `suspects` are ordered by
/// [`root_cause::order`]; a saved report's are ranked again by this build that way.
pub fn verdict(suspects: &[Suspect], telemetry: &[SeriesShift]) -> Option<String> {
    suspects
        .first()
        .filter(|s| s.delta_beta > 0.0 && s.z_beta.abs() >= SIGNIFICANT_Z)
        .map(|s| category(s, telemetry))
}

/// |Z_β| below which the top suspect is reported as no real change.
const SIGNIFICANT_Z: f64 = 2.0;

/// Share of the normal cycle a thread (by name) must run to carry the iteration.
const WORKING_SHARE: f64 = 0.05;

/// The thread names that run at least [`WORKING_SHARE`] of the normal cycles: the threads
/// that do an iteration's work.
fn working_threads(normal: &[Cycle]) -> BTreeSet<String> {
    let mut running: BTreeMap<&str, f64> = BTreeMap::new();
    for c in normal {
        for (k, v) in &c.shares {
            if let Some((State::Running, comm)) = thread_state(k) {
                *running.entry(comm).or_default() += v;
            }
        }
    }
    running
        .into_iter()
        .filter(|(_, total)| *total >= WORKING_SHARE * normal.len() as f64)
        .map(|(comm, _)| comm.to_string())
        .collect()
}

/// `cycles` without the thread states of threads outside `working`.
fn only_working(cycles: &[Cycle], working: &BTreeSet<String>) -> Vec<Cycle> {
    cycles
        .iter()
        .map(|c| Cycle {
            shares: c
                .shares
                .iter()
                .filter(|(k, _)| thread_state(k).is_none_or(|(_, comm)| working.contains(comm)))
                .map(|(k, v)| (k.clone(), *v))
                .collect(),
            utilisation: c.utilisation.clone(),
        })
        .collect()
}

/// Ranks the cycles of `c` in [from, end) against `reference` (end: where its kernel events
/// stop being complete, [`Collected::kernel_complete_until`]).
pub fn root_cause(c: &Collected, timeline: &Timeline, reference: &Reference, from: u64) -> Report {
    let anchor = anchor(c);
    let calls: &[Call] = c.python.as_ref().map_or(&[], |p| &p.calls);
    let (anomalous, anomalous_binned) =
        anomalous_cycles(calls, anchor.as_deref(), from, c.kernel_complete_until());
    let fa = features(c, timeline, &anomalous, anchor.as_deref());
    // Thread states are ranked for the threads that carry the iteration. A thread that
    // hardly runs (vLLM's gloo and ZMQ threads) waits longer for a CPU under any load on the
    // host, and its waits, summed over all its namesakes, outgrew the worker's own; they do
    // not lengthen the iteration. The trace keeps every thread.
    let working = working_threads(&reference.cycles);
    let (suspects, telemetry) = root_cause::rank(
        &only_working(&reference.cycles, &working),
        &only_working(&fa, &working),
        resources,
    );
    let ranked_threads = working.into_iter().collect();
    let named = verdict(&suspects, &telemetry);
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
            category(s, &telemetry),
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
            anomalous_binned,
            reference: reference.source.clone(),
        },
        normal_cycle_ms: reference.mean_cycle_ms,
        category: named,
        anomalous_cycle_ms: mean_ms(&anomalous),
        suspects,
        ranked_threads,
        telemetry,
        summary,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deep_dive::capture::ThreadInfo;
    use crate::deep_dive::timeline::TASK_UNINTERRUPTIBLE;
    use probe_common::{event, Event};

    /// A context switch from `prev` (leaving in `prev_state`, preempted or not) to `next`.
    fn switch(ts_ns: u64, prev: u32, next: u32, prev_state: u64, preempt: bool) -> Event {
        Event {
            ts_ns,
            kind: event::SWITCH as u16,
            tid: prev,
            arg0: u64::from(next),
            arg1: prev_state | u64::from(preempt) << 32,
            ..Event::default()
        }
    }

    /// A syscall event of `kind` (entry, exit or the end of a run of yields) by `tid`.
    fn syscall(ts_ns: u64, kind: u32, tid: u32, nr: i64, arg1: u64) -> Event {
        Event {
            ts_ns,
            kind: kind as u16,
            tid,
            arg0: nr as u64,
            arg1,
            ..Event::default()
        }
    }

    /// `tid` enters (or leaves) sched_yield.
    fn sched_yield(ts_ns: u64, tid: u32, enter: bool) -> Event {
        let kind = if enter {
            event::SYS_ENTER
        } else {
            event::SYS_EXIT
        };
        syscall(ts_ns, kind, tid, libc::SYS_sched_yield, 0)
    }

    /// A thread of process 1.
    fn thread(comm: &str) -> ThreadInfo {
        ThreadInfo {
            pid: 1,
            comm: comm.into(),
            ns_tid: None,
        }
    }

    #[test]
    fn a_yield_is_not_contention_and_is_left_out_of_the_ranking() {
        let c = Collected {
            end_ns: 500,
            kernel: vec![
                // The worker is preempted in user mode (no preempt flag), the spinner runs
                // and yields, the worker runs and blocks on a page fault, the spinner is
                // preempted in the kernel.
                switch(0, 10, 11, 0, false),
                sched_yield(90, 11, true),
                switch(100, 11, 10, 0, false),
                switch(300, 10, 11, TASK_UNINTERRUPTIBLE, false),
                sched_yield(310, 11, false),
                switch(400, 11, 10, 0, true),
            ],
            threads: [(10, thread("worker")), (11, thread("spinner"))].into(),
            ..Collected::default()
        };
        let t = Timeline::build(&c);
        let states = |tid| -> Vec<(u64, u64, State)> {
            t.states[&tid]
                .iter()
                .map(|s| (s.start, s.end, s.what))
                .collect()
        };
        assert_eq!(
            states(10),
            [
                (0, 100, State::Runnable),
                (100, 300, State::Running),
                (300, 400, State::Blocked),
                (400, 500, State::Running)
            ]
        );
        assert_eq!(
            states(11),
            [
                (0, 100, State::Running),
                (100, 300, State::Yielded),
                (300, 400, State::Running),
                (400, 500, State::Runnable)
            ]
        );
        let cycle = CycleSpan {
            start: 0,
            end: 400,
            tid: 0,
            args: BTreeMap::new(),
        };
        let f = features(&c, &t, &[cycle], None);
        let shares: BTreeMap<&str, f64> = f[0]
            .shares
            .iter()
            .map(|(k, v)| (k.name.as_str(), *v))
            .collect();
        assert_eq!(
            shares,
            [
                ("blocked (D) worker", 0.25),
                ("runnable worker", 0.25),
                ("running spinner", 0.5),
                ("running worker", 0.5),
            ]
            .into()
        );
    }

    /// The timeline of a capture of thread 11 alone, ending at `end_ns`, and its syscalls as
    /// (start, end, calls).
    fn thread_11(end_ns: u64, kernel: Vec<Event>) -> (Timeline, Vec<(u64, u64, u64)>) {
        let c = Collected {
            end_ns,
            kernel,
            threads: [(11, thread("worker"))].into(),
            ..Collected::default()
        };
        let t = Timeline::build(&c);
        let spans = t.syscalls[&11]
            .iter()
            .map(|s| (s.start, s.end, s.what.calls))
            .collect();
        (t, spans)
    }

    /// A thread that exits mid-capture (an injected thread at the end of its run): its exit
    /// syscall ends with it, and the thread has no state after it.
    #[test]
    fn a_thread_that_exits_ends_its_exit_syscall_there() {
        let (t, spans) = thread_11(
            10_000,
            vec![
                switch(0, 10, 11, 0, false),
                syscall(100, event::SYS_ENTER, 11, libc::SYS_exit, 0),
                syscall(120, event::EXIT, 11, 0, 0),
            ],
        );
        assert_eq!(spans, [(100, 120, 1)]);
        assert_eq!(t.states[&11].last().map(|s| s.end), Some(120));
    }

    /// A run of sched_yield calls, as the probes stream it: its first entry, a switch inside
    /// one of its calls (a yield that gave the CPU away), and one YIELDS event at its last
    /// exit with the number of calls; then another syscall.
    #[test]
    fn a_run_of_yields_is_one_span_with_its_calls() {
        let (t, spans) = thread_11(
            500,
            vec![
                switch(0, 10, 11, 0, false),
                sched_yield(90, 11, true),
                switch(100, 11, 10, 0, false),
                switch(300, 10, 11, 0, true),
                syscall(350, event::YIELDS, 11, libc::SYS_sched_yield, 40),
                syscall(360, event::SYS_ENTER, 11, libc::SYS_read, 0),
                syscall(370, event::SYS_EXIT, 11, libc::SYS_read, 8),
            ],
        );
        assert_eq!(spans, [(90, 350, 40), (360, 370, 1)]);
        assert_eq!(t.syscalls[&11][0].what.nr as i64, libc::SYS_sched_yield);
        let yielded: Vec<(u64, u64)> = t.states[&11]
            .iter()
            .filter(|s| s.what == State::Yielded)
            .map(|s| (s.start, s.end))
            .collect();
        assert_eq!(yielded, [(100, 300)]);
    }

    #[test]
    fn only_the_threads_that_carry_the_iteration_have_their_states_ranked() {
        let cycle = |shares: &[(EventKind, &str, f64)]| Cycle {
            shares: shares
                .iter()
                .map(|(kind, name, v)| {
                    (
                        EventKey {
                            kind: *kind,
                            name: name.to_string(),
                        },
                        *v,
                    )
                })
                .collect(),
            utilisation: BTreeMap::new(),
        };
        let ts = EventKind::ThreadState;
        let normal = [
            cycle(&[
                (ts, "running VLLM::Worker", 0.9),
                (ts, "running gloo_tcp_loop", 0.01),
                (ts, "runnable gloo_tcp_loop", 0.3),
                (EventKind::Syscall, "poll", 0.2),
            ]),
            cycle(&[
                (ts, "running VLLM::Worker", 0.02),
                (ts, "blocked (D) VLLM::Worker", 0.1),
                (ts, "running gloo_tcp_loop", 0.05),
            ]),
        ];
        // The worker runs 46 % of the cycle on average, gloo 3 %.
        let working = working_threads(&normal);
        assert_eq!(working, ["VLLM::Worker".to_string()].into());
        let kept: Vec<Vec<String>> = only_working(&normal, &working)
            .iter()
            .map(|c| c.shares.keys().map(|k| k.name.clone()).collect())
            .collect();
        assert_eq!(
            kept,
            [
                vec!["running VLLM::Worker", "poll"],
                vec!["blocked (D) VLLM::Worker", "running VLLM::Worker"]
            ]
        );
        assert_eq!(
            parse_state_event(&state_event(State::Blocked, "a b")),
            Some((State::Blocked, "a b"))
        );
        assert_eq!(parse_state_event("runnable"), None);
    }

    /// Blocked (D) time: memory pressure when memory ran short, I/O contention when only the
    /// disk got busier; without `mem.used`, major faults or PSI memory stand for reclaim.
    #[test]
    fn blocked_time_is_memory_pressure_when_memory_ran_short_else_io() {
        let suspect = |kind| Suspect {
            name: "blocked (D) VLLM::Worker".into(),
            kind,
            score: 1.0,
            delta_beta: 0.03,
            z_beta: 3.0,
            z_mu: 7.9,
            resource: Some("psi.io.some".into()),
            normal_beta: 0.0,
            anomalous_beta: 0.03,
        };
        let shift = |name: &str, z| SeriesShift {
            name: name.into(),
            normal_mean: 0.0,
            anomalous_mean: 1.0,
            z,
        };
        let io_only = [shift("psi.io.some", 7.9), shift("vm.pgmajfault", 1.0)];
        let reclaim = [
            shift("psi.io.some", 7.9),
            shift("vm.pgmajfault", 4.5),
            shift("psi.io.full", 6.0),
        ];
        let blocked = suspect(EventKind::ThreadState);
        assert_eq!(category(&blocked, &io_only), "I/O contention");
        assert_eq!(category(&blocked, &reclaim), "memory pressure");
        // With the memory in use sampled: the same faults over a busy disk are I/O unless
        // memory ran short.
        let (used, short) = (shift("mem.used", 0.3), shift("mem.used", 6.0));
        let faults_over_busy_disk = [
            reclaim[0].clone(),
            reclaim[1].clone(),
            reclaim[2].clone(),
            used.clone(),
        ];
        let faults_in_short_memory = [
            reclaim[0].clone(),
            reclaim[1].clone(),
            reclaim[2].clone(),
            short,
        ];
        assert_eq!(category(&blocked, &faults_over_busy_disk), "I/O contention");
        assert_eq!(
            category(&blocked, &faults_in_short_memory),
            "memory pressure"
        );
        // Whichever series gave the suspect's resource.
        let by_faults = Suspect {
            resource: Some("vm.pgmajfault".into()),
            ..blocked.clone()
        };
        assert_eq!(
            category(&by_faults, &faults_over_busy_disk),
            "I/O contention"
        );
        assert_eq!(
            category(&by_faults, &faults_in_short_memory),
            "memory pressure"
        );
        // Refaults from an idle disk: PSI io `some` rose but not `full`, and memory did not
        // run short (the pages were taken by reclaim elsewhere): memory pressure.
        let faults_over_idle_disk = [
            shift("psi.io.some", 2.3),
            shift("psi.io.full", 1.8),
            shift("psi.memory.some", 32.3),
            used,
        ];
        let by_psi_memory = Suspect {
            resource: Some("psi.memory.some".into()),
            ..blocked.clone()
        };
        assert_eq!(
            category(&by_psi_memory, &faults_over_idle_disk),
            "memory pressure"
        );
        assert_eq!(
            category(&by_psi_memory, &faults_over_busy_disk),
            "I/O contention"
        );
        // A read syscall under disk contention stays I/O.
        assert_eq!(
            category(&suspect(EventKind::Syscall), &reclaim),
            "I/O contention"
        );
    }
}
