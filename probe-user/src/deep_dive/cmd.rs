//! `stallscope deep-dive`: an optional normal reference window, then the deep-dive window,
//! with the target running throughout; writes the Perfetto trace and the root-cause report.

use std::{io::BufWriter, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use super::{
    analysis::{self, Report, Timeline},
    capture::{self, Collected, Running},
    trace::{self, IterationSlice, Window, WriteStats},
};
use crate::{
    features::{Features, KernelPaths},
    kernel_plane::KernelPlane,
    procfs,
    python_plane::PythonRequest,
};

/// Options of `stallscope deep-dive`.
#[derive(Debug, clap::Args)]
pub struct DeepDiveArgs {
    /// The engine process (its child processes, e.g. vLLM's workers, are captured too).
    #[arg(long)]
    pub pid: u32,
    /// Also time this Python function (repeatable; same syntax as `probe --watch`).
    #[arg(long = "watch", value_name = "SPEC")]
    pub watch: Vec<pyframe_tracer::WatchSpec>,
    /// Framework profile: `auto`, `vllm`, `sglang` or `generic`.
    #[arg(long, default_value = "auto", value_parser = ["auto", "vllm", "sglang", "generic"])]
    pub framework: String,
    /// Length of the deep-dive window.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Record a normal reference window of this length first; the root-cause ranking
    /// compares the deep-dive window against it.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub baseline: Option<Duration>,
    /// Perfetto trace to write.
    #[arg(short, long)]
    pub output: PathBuf,
    /// Write the root-cause report (JSON) here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// py-spy stack samples per second (0 turns sampling off).
    #[arg(long, default_value_t = 100.0)]
    pub sample_hz: f64,
    /// Host telemetry samples per second.
    #[arg(long, default_value_t = 100.0)]
    pub telemetry_hz: f64,
    /// Keep at most this many raw kernel events (the rest are counted as dropped).
    #[arg(long, default_value_t = 4_000_000)]
    pub max_events: usize,
    /// Stop adding events to the trace past this many bytes (dropped events are counted).
    #[arg(long, default_value_t = 512 << 20)]
    pub max_bytes: u64,
}

/// The JSON report.
#[derive(Debug, Serialize)]
struct DeepDiveReport<'a> {
    pid: u32,
    trace: String,
    normal_window_ms: f64,
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

/// Runs a deep dive and prints its summary.
pub async fn run(args: &DeepDiveArgs, paths: &KernelPaths) -> Result<()> {
    let pid = args.pid;
    procfs::require_target(pid)?;
    if args.duration.is_zero() {
        bail!("--duration must be longer than 0");
    }
    // Open the outputs before touching the target: a bad path must not cost a capture.
    let file = std::fs::File::create(&args.output)
        .with_context(|| format!("cannot create the trace file {}", args.output.display()))?;
    let report_file = args
        .report
        .as_ref()
        .map(|p| {
            std::fs::File::create(p)
                .with_context(|| format!("cannot create the report file {}", p.display()))
        })
        .transpose()?;
    let features = Features::detect(paths);
    features.require()?;
    let mut plane = KernelPlane::load(&features)?;
    let opts = capture::Options {
        pid,
        python: PythonRequest {
            framework: args.framework.clone(),
            watch: args.watch.clone(),
            deep_dive: true,
        },
        sample_hz: args.sample_hz,
        telemetry_hz: args.telemetry_hz,
        max_events: args.max_events,
    };
    let mut running = Running::start(opts, &mut plane)?;
    let (notes, split, interrupted) = hold(&mut running, args).await;
    let mut collected: Collected = running.finish(&mut plane)?;
    collected.notes.extend(notes);
    if interrupted {
        collected
            .notes
            .push("interrupted: the trace covers the part captured before".into());
    }
    let split = split.min(collected.end_ns);
    let timeline = Timeline::build(&collected);
    let report = analysis::root_cause(&collected, &timeline, split);
    let anchor = analysis::anchor(&collected);
    let calls = collected.python.as_ref().map_or(&[][..], |p| &p.calls);
    let iterations: Vec<IterationSlice> = analysis::cycles(
        calls,
        anchor.as_deref(),
        collected.start_ns,
        collected.end_ns,
    )
    .into_iter()
    .filter(|c| c.tid != 0)
    .map(|cycle| IterationSlice {
        cycle,
        stage: "iteration",
        predicted_us: None,
    })
    .collect();
    let mut windows = vec![Window {
        name: "deep dive",
        start: split,
        end: collected.end_ns,
    }];
    if split > collected.start_ns {
        windows.push(Window {
            name: "normal reference",
            start: collected.start_ns,
            end: split,
        });
    }
    let stats = trace::write(
        BufWriter::new(file),
        &collected,
        &timeline,
        &iterations,
        &windows,
        args.max_bytes,
    )
    .with_context(|| format!("writing the trace {}", args.output.display()))?;
    let doc = DeepDiveReport {
        pid,
        trace: args.output.display().to_string(),
        normal_window_ms: (split - collected.start_ns) as f64 / 1e6,
        deep_dive_window_ms: (collected.end_ns - split) as f64 / 1e6,
        first_event_after_trigger_ms: collected
            .first_event_ns()
            .map(|t| (t - collected.trigger_ns) as f64 / 1e6),
        kernel_events: collected.kernel.len(),
        kernel_dropped_over_budget: collected.kernel_over_budget,
        kernel_lost_ring_full: collected.kernel_lost,
        python_calls: calls.len(),
        python_lost_records: collected.python.as_ref().map_or(0, |p| p.lost_records),
        stack_samples: collected.stacks.len(),
        telemetry_samples: collected.telemetry.samples,
        written: &stats,
        notes: &collected.notes,
        root_cause: &report,
    };
    if let Some(f) = report_file {
        serde_json::to_writer_pretty(f, &doc).context("writing the report")?;
    }
    print!("{}", render(&doc));
    Ok(())
}

/// Holds the windows open, polling the capture, with a progress bar. Returns notes, the
/// split between the windows (ns) and whether a signal cut it short.
async fn hold(running: &mut Running, args: &DeepDiveArgs) -> (Vec<String>, u64, bool) {
    let baseline = args.baseline.unwrap_or_default();
    let total = baseline + args.duration;
    let bar = indicatif::ProgressBar::new(total.as_millis() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{msg:>18} [{bar:30}] {elapsed}/{duration} {prefix}",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> "),
    );
    let (Ok(mut sigint), Ok(mut sigterm)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return (vec!["signal handlers unavailable".into()], 0, true);
    };
    let start = tokio::time::Instant::now();
    let mut split = None;
    let mut notes = Vec::new();
    let mut interrupted = false;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= total {
            break;
        }
        if elapsed >= baseline && split.is_none() {
            split = Some(crate::clock::monotonic_ns());
        }
        bar.set_position(elapsed.as_millis() as u64);
        bar.set_message(if split.is_some() {
            "deep dive"
        } else {
            "normal reference"
        });
        bar.set_prefix(format!("{} kernel events", running.kernel_events()));
        if !procfs::process_exists(args.pid) {
            notes.push(format!(
                "process {} exited after {:.2} s",
                args.pid,
                elapsed.as_secs_f64()
            ));
            break;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = sigint.recv() => { interrupted = true; break; }
            _ = sigterm.recv() => { interrupted = true; break; }
        }
        running.poll();
    }
    bar.finish_and_clear();
    let split = split.unwrap_or_else(crate::clock::monotonic_ns);
    (notes, split, interrupted)
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
