//! Writes a capture as one Perfetto trace: a process track per captured process, a thread
//! track per thread (its Python calls as nested slices, with their extracted arguments),
//! child tracks with the thread's scheduler states, syscalls and py-spy samples, an
//! iteration track, the capture windows, GPU stream and CUDA API tracks (the GPU plane's), and
//! a counter track per telemetry series. Every timestamp is CLOCK_MONOTONIC; the trace's
//! clock snapshot converts it.
//!
//! Writing stops adding events once the byte budget is spent (open slices are still
//! closed); what was left out is counted and written into the trace's summary event.

use std::{collections::BTreeMap, io::Write};

use anyhow::Result;
use perfetto_writer::{Arg, ClockReadings, Extra, TraceWriter, Track, Unit, Value};
use serde::Serialize;

use super::{capture::Collected, cycles::CycleSpan, timeline::Timeline};
use crate::kernel_plane::syscall_names;

/// A named time range of the capture (e.g. the normal reference and the deep dive).
#[derive(Debug, Clone)]
pub struct Window {
    /// Name.
    pub name: &'static str,
    /// Start, ns.
    pub start: u64,
    /// End, ns.
    pub end: u64,
}

/// An iteration to draw, with the model's prediction when one exists.
#[derive(Debug, Clone)]
pub struct IterationSlice {
    /// The cycle.
    pub cycle: CycleSpan,
    /// Stage name.
    pub stage: &'static str,
    /// Predicted duration, µs.
    pub predicted_us: Option<f64>,
}

/// What the writer did.
#[derive(Debug, Default, Clone, Serialize)]
pub struct WriteStats {
    /// Track events written.
    pub events: u64,
    /// Bytes written.
    pub bytes: u64,
    /// Events left out because the byte budget was spent.
    pub dropped_events: u64,
    /// The trace's clock snapshot: CLOCK_REALTIME − CLOCK_MONOTONIC, ns (a monotonic stamp
    /// plus this is wall time).
    pub realtime_minus_monotonic_ns: i64,
}

/// A writer that stops opening slices and adding instants or counter values once `max_bytes`
/// is reached, but always closes what it opened.
struct Budgeted<W: Write> {
    w: TraceWriter<W>,
    max_bytes: u64,
    dropped: u64,
}

impl<W: Write> Budgeted<W> {
    fn full(&mut self) -> bool {
        if self.w.bytes() >= self.max_bytes {
            self.dropped += 1;
            return true;
        }
        false
    }

    /// Opens a slice unless the budget is spent; returns whether it did.
    fn begin(&mut self, t: Track, ts: u64, name: &str, args: &[Arg<'_>]) -> Result<bool> {
        if self.full() {
            return Ok(false);
        }
        self.w.begin(
            t,
            ts,
            name,
            Extra {
                args,
                ..Extra::default()
            },
        )?;
        Ok(true)
    }

    fn slice(
        &mut self,
        t: Track,
        start: u64,
        end: u64,
        name: &str,
        args: &[Arg<'_>],
    ) -> Result<()> {
        if self.begin(t, start, name, args)? {
            self.w.end(t, end)?;
        }
        Ok(())
    }

    fn instant(&mut self, t: Track, ts: u64, name: &str, args: &[Arg<'_>]) -> Result<()> {
        if !self.full() {
            self.w.instant(
                t,
                ts,
                name,
                Extra {
                    args,
                    ..Extra::default()
                },
            )?;
        }
        Ok(())
    }

    fn count(&mut self, t: Track, ts: u64, v: f64) -> Result<()> {
        if !self.full() {
            self.w.count(t, ts, v)?;
        }
        Ok(())
    }
}

/// Writes the trace to `out`.
pub fn write<W: Write>(
    out: W,
    c: &Collected,
    timeline: &Timeline,
    iterations: &[IterationSlice],
    windows: &[Window],
    max_bytes: u64,
) -> Result<WriteStats> {
    let clocks = ClockReadings::now();
    let mut b = Budgeted {
        w: TraceWriter::new(out, clocks)?,
        max_bytes,
        dropped: 0,
    };
    let mut processes: BTreeMap<u32, Track> = BTreeMap::new();
    for (pid, name) in &c.processes {
        processes.insert(*pid, b.w.process(*pid, name)?);
    }
    let engine = match processes.get(&c.pid) {
        Some(t) => *t,
        None => b.w.process(c.pid, "engine")?,
    };
    // Capture windows and the summary of what was left out.
    let capture = b.w.child(engine, "stallscope capture")?;
    // Where the engine runs: its pod and container (each field only where known), first on
    // the capture track, whose events go forward in time.
    let id = &c.identity;
    let container_pid = id.pid_in_container.map(u64::from);
    let fields = [
        ("namespace", id.namespace.as_deref()),
        ("pod", id.pod.as_deref()),
        ("container", id.container.as_deref()),
        ("pod_uid", id.pod_uid.as_deref()),
        ("container_id", id.container_id.as_deref()),
        ("runtime", id.runtime),
    ];
    let mut identity_args: Vec<Arg<'_>> = fields
        .iter()
        .filter_map(|&(k, v)| Some(Arg::new(k, Value::Str(v?))))
        .collect();
    identity_args.extend(container_pid.map(|p| Arg::new("container_pid", Value::Uint(p))));
    if !identity_args.is_empty() {
        b.w.instant(
            capture,
            c.start_ns,
            "engine identity",
            Extra {
                args: &identity_args,
                ..Extra::default()
            },
        )?;
    }

    let mut ws = windows.to_vec();
    ws.sort_by_key(|w| w.start);
    for w in &ws {
        b.slice(capture, w.start, w.end, w.name, &[])?;
    }
    let summary_args = [
        Arg::new("kernel_events", Value::Uint(c.kernel.len() as u64)),
        Arg::new(
            "kernel_dropped_over_budget",
            Value::Uint(c.kernel_over_budget),
        ),
        Arg::new("kernel_lost_ring_full", Value::Uint(c.kernel_lost)),
        Arg::new(
            "python_lost_records",
            Value::Uint(c.python.as_ref().map_or(0, |p| p.lost_records)),
        ),
        Arg::new("stack_sample_errors", Value::Uint(c.stack_errors)),
    ];
    b.w.instant(
        capture,
        c.end_ns,
        "capture summary",
        Extra {
            args: &summary_args,
            ..Extra::default()
        },
    )?;

    // Iterations.
    let iter_track = b.w.child(engine, "iterations")?;
    let mut its: Vec<&IterationSlice> = iterations.iter().collect();
    its.sort_by_key(|i| i.cycle.start);
    let mut last_end = 0;
    for it in its {
        // Iterations of one engine thread do not overlap; skip any that would.
        if it.cycle.start < last_end {
            continue;
        }
        last_end = it.cycle.end;
        let actual = (it.cycle.end - it.cycle.start) as f64 / 1e3;
        let mut args = vec![
            Arg::new("actual_us", Value::Double(actual)),
            Arg::new("tid", Value::Uint(u64::from(it.cycle.tid))),
        ];
        if let Some(p) = it.predicted_us {
            args.push(Arg::new("predicted_us", Value::Double(p)));
        }
        for (k, v) in &it.cycle.args {
            args.push(Arg::new(k, Value::Int(*v)));
        }
        b.slice(iter_track, it.cycle.start, it.cycle.end, it.stage, &args)?;
    }

    // Threads: Python calls on the thread track, states, syscalls and samples below it.
    let calls = c.python.as_ref().map(|p| p.calls.as_slice()).unwrap_or(&[]);
    let mut calls_by_tid: BTreeMap<u32, Vec<&pyframe_tracer::session::Call>> = BTreeMap::new();
    for call in calls {
        calls_by_tid.entry(call.tid as u32).or_default().push(call);
    }
    let mut samples_by_tid: BTreeMap<u32, Vec<(u64, String, String)>> = BTreeMap::new();
    for (ts, stacks) in &c.stacks {
        for s in stacks {
            if let (Some(tid), Some(top)) = (s.tid, s.frames.first()) {
                let stack: Vec<String> = s
                    .frames
                    .iter()
                    .map(|f| format!("{} ({}:{})", f.func, f.file, f.line))
                    .collect();
                samples_by_tid.entry(tid as u32).or_default().push((
                    *ts,
                    top.func.clone(),
                    stack.join("\n"),
                ));
            }
        }
    }
    let mut thread_tracks: BTreeMap<u32, Track> = BTreeMap::new();
    for (tid, info) in &c.threads {
        let name = match info.ns_tid {
            Some(n) => format!("{} (tid {n} in its container)", info.comm),
            None => info.comm.clone(),
        };
        let thread = b.w.thread(info.pid, *tid, &name)?;
        thread_tracks.insert(*tid, thread);
        if let Some(calls) = calls_by_tid.get_mut(tid) {
            write_nested_calls(&mut b, thread, calls)?;
        }
        if let Some(states) = timeline.states.get(tid) {
            let t = b.w.child(thread, &format!("{} {tid} state", info.comm))?;
            for s in states {
                b.slice(t, s.start, s.end, s.what.name(), &[])?;
            }
        }
        if let Some(sys) = timeline.syscalls.get(tid) {
            let t =
                b.w.child(thread, &format!("{} {tid} syscalls", info.comm))?;
            for s in sys {
                let name = syscall_names::name(s.what.nr);
                let calls = [Arg::new("calls", Value::Uint(s.what.calls))];
                let args: &[Arg<'_>] = if s.what.calls > 1 { &calls } else { &[] };
                b.slice(t, s.start, s.end, &name, args)?;
            }
        }
        if let Some(samples) = samples_by_tid.get(tid) {
            let t = b.w.child(thread, &format!("{} {tid} py-spy", info.comm))?;
            for (ts, top, stack) in samples {
                b.instant(t, *ts, top, &[Arg::new("stack", Value::Str(stack))])?;
            }
        }
    }

    // GPU streams and CUDA API calls (bounded by the window, not by the byte budget).
    for (pid, events) in &c.gpu {
        let process = match processes.get(pid) {
            Some(t) => *t,
            None => b.w.process(*pid, "cuda")?,
        };
        let mut thread = |w: &mut TraceWriter<W>, tid: u32| match thread_tracks.get(&tid) {
            Some(t) => Ok(*t),
            None => {
                let t = w.thread(*pid, tid, &format!("thread {tid}"))?;
                thread_tracks.insert(tid, t);
                Ok(t)
            }
        };
        crate::gpu_plane::trace::write(&mut b.w, process, &mut thread, events)?;
    }

    // Telemetry counters.
    for (name, s) in &c.telemetry.series {
        let t = b.w.counter(None, name, Unit::Plain(s.unit))?;
        for (ts, v) in &s.points {
            b.count(t, *ts, *v)?;
        }
    }
    let stats = WriteStats {
        events: b.w.events(),
        bytes: b.w.bytes(),
        dropped_events: b.dropped,
        realtime_minus_monotonic_ns: clocks.realtime_ns as i64 - clocks.monotonic_ns as i64,
    };
    b.w.finish()?.flush()?;
    Ok(stats)
}

/// Python calls of one thread as nested slices (a call that outlives its parent is cut at
/// the parent's end, so the nesting stays valid).
fn write_nested_calls<W: Write>(
    b: &mut Budgeted<W>,
    track: Track,
    calls: &mut [&pyframe_tracer::session::Call],
) -> Result<()> {
    calls.sort_by(|a, b| a.start_ns.cmp(&b.start_ns).then(b.end_ns.cmp(&a.end_ns)));
    // (end, written)
    let mut stack: Vec<(u64, bool)> = Vec::new();
    for call in calls.iter() {
        while let Some(&(end, written)) = stack.last() {
            if end > call.start_ns {
                break;
            }
            if written {
                b.w.end(track, end)?;
            }
            stack.pop();
        }
        let end = stack
            .last()
            .map_or(call.end_ns, |&(parent_end, _)| call.end_ns.min(parent_end));
        let args: Vec<Arg<'_>> = call
            .args
            .iter()
            .map(|(k, v)| Arg::new(k, Value::Int(*v)))
            .chain(
                call.exception
                    .then(|| Arg::new("exception", Value::Bool(true))),
            )
            .collect();
        let written = b.begin(track, call.start_ns, &call.func, &args)?;
        stack.push((end, written));
    }
    while let Some((end, written)) = stack.pop() {
        if written {
            b.w.end(track, end)?;
        }
    }
    Ok(())
}
