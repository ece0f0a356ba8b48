//! `stallscope gpu`: attach the CUPTI agent to a live Python engine for a window, then detach
//! and report what ran on the GPU (counts, correlation join, launch latency, busy share, top
//! kernels, clock alignment), optionally as a Perfetto trace.

use std::{collections::HashMap, io::BufWriter, path::PathBuf, time::Duration};

use anyhow::{Context, Result};
use perfetto_writer::{ClockReadings, TraceWriter};
use serde_json::json;

use cupti_sys::sampling::Sampling;

use crate::gpu_plane::{agent_library, summary, traced::Traced, GpuPlane};
use crate::{os::clock::monotonic_ns, os::procfs, os::stop_flag};

/// Options of `stallscope gpu`.
#[derive(Debug, clap::Args)]
pub struct GpuArgs {
    /// The Python process that runs CUDA work (e.g. vLLM's worker).
    #[arg(long)]
    pub pid: u32,
    /// How long to trace.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Write a Perfetto trace of the window here.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
    /// The share of the time CUPTI traces: "always", or ON/EVERY ("1s/10s"), on while
    /// CLOCK_MONOTONIC modulo EVERY is under ON; the report's figures cover the whole window,
    /// its traced spans say which parts were traced.
    #[arg(long, default_value = "always")]
    pub sample: Sampling,
}

/// Runs `stallscope gpu`.
pub fn run(args: &GpuArgs) -> Result<()> {
    procfs::require_target(args.pid)?;
    let file = args
        .output
        .as_ref()
        .map(|p| {
            std::fs::File::create(p)
                .with_context(|| format!("cannot create the trace file {}", p.display()))
        })
        .transpose()?;
    let agent = agent_library()?;
    stop_flag::install(false);
    let mut plane = GpuPlane::attach(args.pid, &agent, args.sample)?;
    let from = monotonic_ns();
    let mut events = Vec::new();
    let deadline = std::time::Instant::now() + args.duration;
    let mut stopped_early = false;
    while std::time::Instant::now() < deadline {
        if stop_flag::requested() || !plane.running() {
            stopped_early = true;
            break;
        }
        plane.poll(&mut events);
        std::thread::sleep(Duration::from_millis(100));
    }
    let to = monotonic_ns();
    let (lost, cupti_dropped) = plane.losses();
    let version = plane.cupti_version();
    let subscription = plane.subscription().map(|m| m.name());
    let clock = plane.clock().clone();
    let pid = plane.pid();
    let unloaded = plane.detach(&mut events)?;
    let s = summary::summarise(&events, from, to);
    let traced = Traced::of(&events).within(from, to);
    let mut trace_slices = None;
    if let Some(f) = file {
        let mut w = TraceWriter::new(BufWriter::new(f), ClockReadings::now())?;
        let comm = procfs::thread_comm(pid, pid).unwrap_or_else(|| "engine".into());
        let process = w.process(pid, &comm)?;
        let mut threads = HashMap::new();
        let mut thread = |w: &mut TraceWriter<_>, tid: u32| match threads.get(&tid) {
            Some(t) => Ok(*t),
            None => {
                let name = procfs::thread_comm(pid, tid).unwrap_or_else(|| format!("thread {tid}"));
                let t = w.thread(pid, tid, &name)?;
                threads.insert(tid, t);
                Ok(t)
            }
        };
        trace_slices = Some(crate::gpu_plane::trace::write(
            &mut w,
            process,
            &mut thread,
            &events,
        )?);
        w.finish()?;
    }
    let report = json!({
        "pid": pid,
        "cupti_version": version,
        "subscription": subscription,
        "window_s": (to - from) as f64 / 1e9,
        "window_ns": [from, to],
        "sampling": args.sample.to_string(),
        "traced_ns": traced,
        "stopped_early": stopped_early,
        "summary": s,
        "clock": {
            "samples": clock.samples(),
            "uncertainty_ns": clock.uncertainty_ns(),
            "drift_ns": clock.drift_ns(),
        },
        "lost_events": lost,
        "cupti_dropped": cupti_dropped,
        "agent": agent,
        "agent_unloaded": unloaded,
        "trace": args.output,
        "trace_slices": trace_slices,
    });
    if args.json {
        println!("{report}");
        return Ok(());
    }
    println!(
        "GPU plane on process {pid} (CUPTI {version}, subscriber {}) for {:.1} s: {} kernels, {} copies, {} memsets, {} API calls, {} synchronizations",
        subscription.unwrap_or("unknown"),
        (to - from) as f64 / 1e9,
        s.kernels,
        s.memcpys,
        s.memsets,
        s.api_calls,
        s.synchronizations
    );
    if !args.sample.always() {
        let secs: u64 = traced.iter().map(|(a, b)| b - a).sum();
        println!(
            "  traced {} of the time ({} spans, {:.1} s)",
            args.sample,
            traced.len(),
            secs as f64 / 1e9
        );
    }
    if let Some(c) = s.correlated_pct {
        println!("  joined to their launching call: {c:.1} %");
    }
    if let Some(l) = s.launch_to_start_us {
        println!(
            "  launch to start: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs",
            l.p50, l.p99, l.max
        );
    }
    for (d, b) in &s.busy_pct {
        println!("  GPU {d} busy {b:.1} % of the window");
    }
    for k in &s.top_kernels {
        println!("  {:>8.3} ms {:>6}× {}", k.total_ms, k.count, k.name);
    }
    println!(
        "  clock: {} samples, ±{} ns, drift {} ns; lost {lost}, CUPTI dropped {cupti_dropped}; agent {}",
        clock.samples(),
        clock.uncertainty_ns().unwrap_or(0),
        clock.drift_ns().unwrap_or(0),
        if unloaded { "unloaded" } else { "left loaded (idle)" }
    );
    Ok(())
}
