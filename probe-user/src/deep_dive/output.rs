//! What a finished capture becomes: the Perfetto trace (iterations, capture windows), the
//! root-cause ranking against a normal reference, the JSON report and its text summary.
//! Shared by `stallscope deep-dive` and the daemon's deep dives.

use std::{fs::File, io::Write, path::Path};

use anyhow::{Context, Result};
use serde::Serialize;

use super::{
    analysis::{self, Reference, Report},
    capture::Collected,
    cycles,
    timeline::Timeline,
    trace::{self, IterationSlice, Window, WriteStats},
};

/// The normal reference a report compares against.
pub enum Baseline<'a> {
    /// The part of the capture before the split (a normal window recorded first), described.
    Window(&'a str),
    /// A reference recorded earlier (the daemon's rolling reference).
    Kept(&'a Reference),
}

/// The JSON report.
#[derive(Debug, Serialize)]
struct DeepDiveReport<'a> {
    pid: u32,
    identity: &'a pod_identity::Identity,
    trace: String,
    normal_window_ms: f64,
    /// A scheduled deep dive's capture before its instant.
    lead_in_ms: f64,
    deep_dive_window_ms: f64,
    first_event_after_trigger_ms: Option<f64>,
    kernel_events: usize,
    kernel_dropped_over_budget: u64,
    kernel_lost_ring_full: u64,
    python_calls: usize,
    python_lost_records: u64,
    stack_samples: usize,
    telemetry_samples: u64,
    written: &'a WriteStats,
    notes: &'a [String],
    #[serde(flatten)]
    root_cause: &'a Report,
}

/// A written deep dive.
pub struct Written {
    /// The ranking.
    pub report: Report,
    /// Trace size.
    pub stats: WriteStats,
    /// The text summary (what `stallscope deep-dive` prints).
    pub rendered: String,
}

/// Writes the trace of `c` (normal window [start, split), deep dive [split, end)) and, when
/// `report` is given, the JSON report; ranks the deep-dive window against `baseline` (None:
/// there is no reference to compare with).
pub fn write<W: Write>(
    c: &Collected,
    split: u64,
    baseline: Option<Baseline<'_>>,
    trace_out: W,
    trace_path: &Path,
    report: Option<File>,
    max_bytes: u64,
) -> Result<Written> {
    let split = split.clamp(c.start_ns, c.end_ns);
    // What comes before the split: the normal window the deep dive is ranked against, or a
    // scheduled deep dive's lead-in (its sources started ahead of its instant).
    let lead_in = !matches!(baseline, Some(Baseline::Window(_)));
    let timeline = Timeline::build(c);
    let window;
    let reference = match baseline {
        Some(Baseline::Kept(r)) => r,
        Some(Baseline::Window(what)) => {
            window = Reference::from_window(c, &timeline, c.start_ns, split, what.to_string());
            &window
        }
        None => {
            window = Reference {
                source: "no normal reference yet".into(),
                ..Reference::default()
            };
            &window
        }
    };
    let report_doc = analysis::root_cause(c, &timeline, reference, split);
    let anchor = cycles::anchor(c);
    let calls = c.python.as_ref().map_or(&[][..], |p| &p.calls);
    let iterations: Vec<IterationSlice> =
        cycles::cycles(calls, anchor.as_deref(), c.start_ns, c.end_ns)
            .into_iter()
            .filter(|c| c.tid != 0)
            .map(|cycle| IterationSlice {
                cycle,
                stage: "iteration",
                predicted_us: None,
            })
            .collect();
    let before_ms = (split - c.start_ns) as f64 / 1e6;
    let mut windows = vec![Window {
        name: "deep dive",
        start: split,
        end: c.end_ns,
    }];
    if split > c.start_ns {
        windows.push(Window {
            name: if lead_in {
                "lead-in"
            } else {
                "normal reference"
            },
            start: c.start_ns,
            end: split,
        });
    }
    let stats = trace::write(trace_out, c, &timeline, &iterations, &windows, max_bytes)
        .with_context(|| format!("writing the trace {}", trace_path.display()))?;
    let doc = DeepDiveReport {
        pid: c.pid,
        identity: &c.identity,
        trace: trace_path.display().to_string(),
        normal_window_ms: if lead_in { 0.0 } else { before_ms },
        lead_in_ms: if lead_in { before_ms } else { 0.0 },
        deep_dive_window_ms: (c.end_ns - split) as f64 / 1e6,
        first_event_after_trigger_ms: c.first_event_ns().map(|t| (t - c.trigger_ns) as f64 / 1e6),
        kernel_events: c.kernel.len(),
        kernel_dropped_over_budget: c.kernel_over_budget,
        kernel_lost_ring_full: c.kernel_lost,
        python_calls: calls.len(),
        python_lost_records: c.python.as_ref().map_or(0, |p| p.lost_records),
        stack_samples: c.stacks.len(),
        telemetry_samples: c.telemetry.samples,
        written: &stats,
        notes: &c.notes,
        root_cause: &report_doc,
    };
    if let Some(f) = report {
        serde_json::to_writer_pretty(f, &doc).context("writing the report")?;
    }
    let rendered = render(&doc);
    Ok(Written {
        report: report_doc,
        stats,
        rendered,
    })
}

fn render(d: &DeepDiveReport<'_>) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let w = d.written;
    let _ = writeln!(
        s,
        "trace {}: {} events, {:.1} MiB ({:.1} bytes/event), {} dropped by the byte budget",
        d.trace,
        w.events,
        w.bytes as f64 / (1 << 20) as f64,
        w.bytes as f64 / w.events.max(1) as f64,
        w.dropped_events
    );
    let _ = writeln!(
        s,
        "captured: {} kernel events ({} over budget, {} lost), {} Python calls ({} lost), {} stack samples, {} telemetry samples; first event {} after the trigger",
        d.kernel_events,
        d.kernel_dropped_over_budget,
        d.kernel_lost_ring_full,
        d.python_calls,
        d.python_lost_records,
        d.stack_samples,
        d.telemetry_samples,
        d.first_event_after_trigger_ms
            .map_or("-".to_string(), |m| format!("{m:.2} ms"))
    );
    let r = d.root_cause;
    let _ = writeln!(
        s,
        "cycles ({}): {} normal, mean {:.2} ms; {} in the deep dive, mean {:.2} ms",
        r.cycles.anchor,
        r.cycles.normal,
        r.normal_cycle_ms,
        r.cycles.anomalous,
        r.anomalous_cycle_ms
    );
    let _ = writeln!(s, "{}", r.summary);
    if !r.suspects.is_empty() {
        let _ = writeln!(
            s,
            "{:>4} {:<12} {:<56} {:>9} {:>8} {:>8} {:>8}",
            "RANK", "KIND", "SUSPECT", "SCORE", "ΔBETA", "Z_BETA", "Z_MU"
        );
    }
    for (i, x) in r.suspects.iter().take(8).enumerate() {
        let _ = writeln!(
            s,
            "{:>4} {:<12} {:<56} {:>9.3} {:>8.3} {:>8.1} {:>8.1}",
            i + 1,
            format!("{:?}", x.kind),
            x.name,
            x.score,
            x.delta_beta,
            x.z_beta,
            x.z_mu
        );
    }
    for n in d.notes {
        let _ = writeln!(s, "note: {n}");
    }
    s
}
