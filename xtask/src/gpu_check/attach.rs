//! `stallscope gpu` attached and detached in turn (A/B windows in one run): kernel, copy and
//! API counts, the correlation join, clock alignment of every synchronize record against the
//! loop's own stamps, the throughput cost while attached, and what each detach leaves behind.

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use serde_json::{json, Value};
use sys_util::clock::monotonic_ns;

use super::decode_loop::{quantile, DecodeLoop};

/// Length of each A and each B window.
const WINDOW: Duration = Duration::from_secs(6);
/// Attached time left out at each end of a B window (attach and detach themselves).
const EDGE_NS: u64 = 1_500_000_000;

/// How far each synchronize call in `trace` lies outside the loop's stamps of it, ns.
fn alignment_errors(trace: &Path, pid: u32, syncs: &[(u64, u64)]) -> Result<Vec<u64>> {
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

/// Runs `rounds` rounds; the first round's trace stays in `out_dir` as `gpu.pftrace`.
pub fn run(bin: &Path, target: &mut DecodeLoop, out_dir: &Path, rounds: usize) -> Result<Value> {
    let pid = target.pid;
    let before = target.footprint();
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let (mut reports, mut errors, mut footprints) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let a = monotonic_ns();
        std::thread::sleep(WINDOW);
        off.push((a, monotonic_ns()));
        let trace = out_dir.join(if round == 0 {
            "gpu.pftrace".to_string()
        } else {
            format!("gpu-{round}.pftrace")
        });
        let started = Instant::now();
        let s = monotonic_ns();
        let out = Command::new(bin)
            .args(["gpu", "--pid", &pid.to_string(), "--json", "--duration"])
            .arg(format!("{}s", WINDOW.as_secs()))
            .arg("-o")
            .arg(&trace)
            .output()?;
        let e = monotonic_ns();
        if !out.status.success() {
            bail!(
                "stallscope gpu failed (round {round}): {}",
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
        errors.extend(alignment_errors(&trace, pid, &target.syncs())?);
        if round > 0 {
            let _ = std::fs::remove_file(&trace);
        }
        footprints.push(target.footprint());
        reports.push(r);
    }
    let (a, b) = (target.mean_tps(&off), target.mean_tps(&on));
    // Each round's cost, to show the spread.
    let pairs: Vec<Option<f64>> = off
        .iter()
        .zip(&on)
        .map(|(x, y)| {
            target
                .mean_tps(std::slice::from_ref(x))
                .zip(target.mean_tps(std::slice::from_ref(y)))
                .map(|(x, y)| 100.0 * (x - y) / x)
        })
        .collect();
    errors.sort_unstable();
    let join: Vec<f64> = reports
        .iter()
        .filter_map(|r| r["summary"]["correlated_pct"].as_f64())
        .collect();
    let pick =
        |k: &str| -> Vec<Value> { reports.iter().map(|r| r["summary"][k].clone()).collect() };
    let last = reports.last().cloned().unwrap_or(Value::Null);
    Ok(json!({
        "kernels_per_window": pick("kernels"),
        "memcpys_per_window": pick("memcpys"),
        "summaries": reports.iter().map(|r| r["summary"].clone()).collect::<Vec<_>>(),
        "correlated_pct_min": join.iter().copied().fold(f64::INFINITY, f64::min),
        "clock": last["clock"],
        "alignment_error_ns": {
            "calls": errors.len(),
            "p50": quantile(&errors, 0.5),
            "p99": quantile(&errors, 0.99),
            "max": errors.last(),
        },
        "tokens_per_s": {"detached": a, "attached": b, "windows": rounds, "window_s": WINDOW.as_secs()},
        "overhead_pct": a.zip(b).map(|(a, b)| 100.0 * (a - b) / a),
        "overhead_pct_per_round": pairs,
        "lost_events": reports.iter().map(|r| r["lost_events"].clone()).collect::<Vec<_>>(),
        "cupti_dropped": reports.iter().map(|r| r["cupti_dropped"].clone()).collect::<Vec<_>>(),
        "subscription": last["subscription"],
        "cupti_version": last["cupti_version"],
        "agent_unloaded": reports.iter().all(|r| r["agent_unloaded"] == true),
        "footprint_before": before.json(),
        "footprint_after_each_detach": footprints.iter().map(|f| f.json()).collect::<Vec<_>>(),
        "clean_detach": footprints.iter().all(|f| f.clean()),
        "first_report": reports.first(),
    }))
}
