//! `cargo xtask gpu-check`: the GPU plane on a real GPU (a machine with a driver and PyTorch).
//!
//! Starts a warm decode loop (tests/targets/gpu_decode.py), then alternates windows without
//! and with `stallscope gpu` attached (A/B, three each) and reports kernel and copy counts,
//! the correlation join rate (goal ≥ 95 %), CPU↔GPU clock alignment (every
//! cudaDeviceSynchronize record against the loop's own CLOCK_MONOTONIC stamps around the
//! call; goal p99 ≤ 100 µs), the throughput cost while attached, and the Perfetto traces.
//! It uses the binaries already built (`cargo build --release -p probe-user -p cupti-agent`).

use std::{
    io::{BufRead, BufReader},
    process::{Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sys_util::clock::monotonic_ns;

use crate::{root, stallscope_bin};

/// Length of each A and each B window.
const WINDOW: Duration = Duration::from_secs(6);
/// Rounds of (detached, attached).
const ROUNDS: usize = 3;
/// Attached time left out at each end of a B window (attach and detach themselves).
const EDGE_NS: u64 = 1_500_000_000;

#[derive(Default)]
struct Seen {
    /// (t0, t1) around each torch.cuda.synchronize().
    syncs: Vec<(u64, u64)>,
    /// (ns, tokens/s).
    tps: Vec<(u64, f64)>,
}

fn mean_tps(seen: &Seen, windows: &[(u64, u64)]) -> Option<f64> {
    let v: Vec<f64> = seen
        .tps
        .iter()
        .filter(|(t, _)| windows.iter().any(|(a, b)| a <= t && t <= b))
        .map(|(_, x)| *x)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// How far each synchronize call in `trace` lies outside the loop's stamps of it, ns.
fn alignment_errors(trace: &std::path::Path, pid: u32, syncs: &[(u64, u64)]) -> Result<Vec<u64>> {
    let d = perfetto_writer::read::decode(&std::fs::read(trace)?)
        .map_err(|e| anyhow::anyhow!("{}: {e}", trace.display()))?;
    let mut out = Vec::new();
    for s in d
        .slices
        .iter()
        .filter(|s| s.name == "cudaDeviceSynchronize" && d.thread_of(s.track) == Some(pid))
    {
        // The stamp pair whose t0 is the last one before the call began.
        let i = syncs.partition_point(|(t0, _)| *t0 <= s.start);
        let Some(&(t0, t1)) = i.checked_sub(1).and_then(|i| syncs.get(i)) else {
            continue;
        };
        out.push(t0.saturating_sub(s.start).max(s.end.saturating_sub(t1)));
    }
    Ok(out)
}

/// Runs the check and prints its report.
pub fn run() -> Result<()> {
    let bin = stallscope_bin();
    let agent = bin.with_file_name("libstallscope_cupti_agent.so");
    for f in [&bin, &agent] {
        if !f.exists() {
            bail!(
                "{} is missing: cargo build --release -p probe-user -p cupti-agent",
                f.display()
            );
        }
    }
    let python = std::env::var("STALLSCOPE_GPU_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&python)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)",
        ])
        .status()
        .with_context(|| format!("cannot run {python}"))?;
    if !ok.success() {
        bail!("no CUDA GPU with PyTorch for {python}: gpu-check runs on a GPU machine (STALLSCOPE_GPU_PYTHON picks the interpreter)");
    }
    let out_dir = root().join("target/gpu-check");
    std::fs::create_dir_all(&out_dir)?;
    let mut child = Command::new(&python)
        .arg(root().join("tests/targets/gpu_decode.py"))
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot start the decode loop")?;
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let ready = lines.next().transpose()?.unwrap_or_default();
    if !ready.starts_with("ready") {
        let _ = child.kill();
        bail!("the decode loop did not start: {ready}");
    }
    let seen = Arc::new(Mutex::new(Seen::default()));
    let sink = seen.clone();
    std::thread::spawn(move || {
        for l in lines.map_while(Result::ok) {
            let f: Vec<&str> = l.split_whitespace().collect();
            let mut s = sink.lock().expect("lock");
            match f[..] {
                ["sync", a, b] => {
                    if let (Ok(a), Ok(b)) = (a.parse(), b.parse()) {
                        s.syncs.push((a, b));
                    }
                }
                ["tps", t, v] => {
                    if let (Ok(t), Ok(v)) = (t.parse(), v.parse()) {
                        s.tps.push((t, v));
                    }
                }
                _ => {}
            }
        }
    });
    eprintln!(
        "gpu-check: {} decode loop (pid {pid}) warming up",
        &ready[6..]
    );
    std::thread::sleep(Duration::from_secs(10));
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut reports = Vec::new();
    let mut errors = Vec::new();
    let result = (|| -> Result<()> {
        for round in 0..ROUNDS {
            let a = monotonic_ns();
            std::thread::sleep(WINDOW);
            off.push((a, monotonic_ns()));
            let trace = out_dir.join(format!("gpu-{round}.pftrace"));
            let started = Instant::now();
            let s = monotonic_ns();
            let out = Command::new(&bin)
                .args(["gpu", "--pid", &pid.to_string(), "--json", "--duration"])
                .arg(format!("{}s", WINDOW.as_secs()))
                .arg("-o")
                .arg(&trace)
                .output()?;
            let e = monotonic_ns();
            if !out.status.success() {
                bail!(
                    "stallscope gpu failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            on.push((s + EDGE_NS, e.saturating_sub(EDGE_NS)));
            let r: Value = serde_json::from_slice(&out.stdout)?;
            eprintln!(
                "gpu-check: round {round}: {} kernels in {:.1} s",
                r["summary"]["kernels"],
                started.elapsed().as_secs_f64()
            );
            std::thread::sleep(Duration::from_millis(500));
            let syncs = seen.lock().expect("lock").syncs.clone();
            errors.extend(alignment_errors(&trace, pid, &syncs)?);
            reports.push(r);
        }
        Ok(())
    })();
    let _ = child.kill();
    let _ = child.wait();
    result?;
    let seen = seen.lock().expect("lock");
    let (a, b) = (mean_tps(&seen, &off), mean_tps(&seen, &on));
    errors.sort_unstable();
    let p99 = errors
        .get(((errors.len().max(1) - 1) as f64 * 0.99).round() as usize)
        .copied();
    let last = reports.last().cloned().unwrap_or(Value::Null);
    let join: Vec<f64> = reports
        .iter()
        .filter_map(|r| r["summary"]["correlated_pct"].as_f64())
        .collect();
    let report = json!({
        "workload": &ready[6..],
        "kernels_per_window": reports.iter().map(|r| r["summary"]["kernels"].clone()).collect::<Vec<_>>(),
        "memcpys_per_window": reports.iter().map(|r| r["summary"]["memcpys"].clone()).collect::<Vec<_>>(),
        "correlated_pct_min": join.iter().copied().fold(f64::INFINITY, f64::min),
        "launch_to_start_us": last["summary"]["launch_to_start_us"],
        "clock": last["clock"],
        "alignment_error_ns": {"calls": errors.len(), "p99": p99, "max": errors.last()},
        "tokens_per_s": {"detached": a, "attached": b},
        "overhead_pct": a.zip(b).map(|(a, b)| 100.0 * (a - b) / a),
        "lost_events": reports.iter().map(|r| r["lost_events"].clone()).collect::<Vec<_>>(),
        "agent_unloaded": reports.iter().all(|r| r["agent_unloaded"] == true),
        "traces": out_dir,
    });
    std::fs::write(
        out_dir.join("report.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
