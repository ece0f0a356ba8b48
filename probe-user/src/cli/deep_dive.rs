//! `stallscope deep-dive`: an optional normal reference window, then the deep-dive window,
//! with the target running throughout; writes the Perfetto trace and the root-cause report.

use std::{io::BufWriter, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    deep_dive::{
        capture::{self, Collected, PythonSource, Running},
        output::{self, Baseline},
    },
    kernel_plane::features::{Features, KernelPaths},
    kernel_plane::KernelPlane,
    os::procfs,
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
    /// Leave the GPU plane out (by default it attaches to every process of the engine that
    /// has CUPTI loaded).
    #[arg(long)]
    pub no_gpu: bool,
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
        python: PythonSource::Attach(PythonRequest {
            framework: args.framework.clone(),
            watch: args.watch.clone(),
            deep_dive: true,
        }),
        sample_hz: args.sample_hz,
        telemetry_hz: args.telemetry_hz,
        kernel_events: true,
        max_events: args.max_events,
        gpu: !args.no_gpu,
        identity: identify(pid)?,
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
    let reference = (split > collected.start_ns).then_some(Baseline::Window(
        "the --baseline window before the deep dive",
    ));
    let out = output::write(
        &collected,
        split,
        reference,
        BufWriter::new(file),
        &args.output,
        report_file,
        args.max_bytes,
    )?;
    print!("{}", out.rendered);
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
    // Said on stderr as `probe` says its window, so that a script knows when each window runs.
    let say = |what: &str| {
        bar.suspend(|| {
            eprintln!(
                "deep-dive: {what} window open (pid {}, t={} ns)",
                args.pid,
                crate::os::clock::monotonic_ns()
            )
        })
    };
    if !baseline.is_zero() {
        say("normal reference");
    }
    let mut split = None;
    let mut notes = Vec::new();
    let mut interrupted = false;
    loop {
        let elapsed = start.elapsed();
        if elapsed >= total {
            break;
        }
        if elapsed >= baseline && split.is_none() {
            split = Some(crate::os::clock::monotonic_ns());
            say("deep-dive");
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
    let split = split.unwrap_or_else(crate::os::clock::monotonic_ns);
    (notes, split, interrupted)
}

/// The target's pod and container, named by the node's kubelet as the daemon's default
/// `[pods]` settings reach it (the ids alone when it does not answer).
fn identify(pid: u32) -> Result<pod_identity::Identity> {
    let pods = crate::config::PodsConfig::default();
    let resolver = pod_identity::Resolver::new(pods.source()?, pods.timeout);
    Ok(resolver.wait(pid, pod_identity::Resolver::patience(pods.timeout)))
}
