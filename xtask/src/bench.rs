//! `cargo xtask bench`: the kernel plane's cost and throughput, measured on real
//! workloads, printed as Markdown for BENCHMARKS.md.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{Context, Result};
use serde_json::Value;

fn workload_bin() -> std::path::PathBuf {
    crate::root().join("target/release/stallscope-workload")
}

/// Starts a workload and returns it with its announcement line.
fn start_workload(args: &[&str]) -> Result<(Child, BufReader<std::process::ChildStdout>, Value)> {
    let mut child = Command::new(workload_bin())
        .args(args)
        .stdout(Stdio::piped())
        .spawn()?;
    let mut out = BufReader::new(child.stdout.take().context("workload stdout")?);
    let mut line = String::new();
    out.read_line(&mut line)?;
    Ok((child, out, serde_json::from_str(&line)?))
}

fn probe_json(pid: u64, args: &[&str]) -> Result<Value> {
    let out = Command::new(crate::stallscope_bin())
        .args(["probe", "--pid", &pid.to_string(), "--json"])
        .args(args)
        .env("RUST_LOG", "warn")
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "probe failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// Runs every benchmark and prints the report.
pub fn run() -> Result<()> {
    println!("## Kernel plane (`cargo xtask bench`)\n");
    per_event_cost()?;
    deep_dive_throughput()?;
    overhead_ratio()?;
    Ok(())
}

/// In-kernel cost per event of each program (BPF_ENABLE_STATS run_time / run_cnt) while a
/// context-switch-heavy workload runs, watched (both sides of every switch are watched
/// threads), then unwatched (the probes watch an idle process; what every other process on the
/// node pays).
fn per_event_cost() -> Result<()> {
    for watched in [true, false] {
        println!(
            "### In-kernel cost per event (sentinel mode, pingpong workload {})\n",
            if watched {
                "watched"
            } else {
                "running, not watched: the probes watch an idle process"
            }
        );
        println!(
            "| tracepoint | program | runs | ns/run | ns/run above the empty program |\n|---|---|---:|---:|---:|"
        );
        let (child, _out, info) = start_workload(&["pingpong", "--seconds", "8"])?;
        let mut idle = None;
        let pid = if watched {
            info["pid"].as_u64().context("no pid from the workload")?
        } else {
            let c = Command::new("sleep").arg("30").spawn()?;
            let pid = u64::from(c.id());
            idle = Some(c);
            pid
        };
        let report = probe_json(pid, &["--duration", "5s", "--prog-stats"]);
        stop(child);
        if let Some(mut c) = idle {
            let _ = c.kill();
            let _ = c.wait();
        }
        let report = report?;
        let programs = report["programs"].as_array().context("no program stats")?;
        let per_run = |p: &Value| {
            let runs = p["run_count"].as_f64().unwrap_or(0.0);
            (
                runs,
                p["run_time_ns"].as_f64().unwrap_or(0.0) / runs.max(1.0),
            )
        };
        // The empty program on sched_switch: what the statistics add to every figure.
        let floor = programs
            .iter()
            .find(|p| p["program"] == probe_common::prog::EMPTY)
            .map(|p| per_run(p).1);
        for p in programs {
            let (runs, ns) = per_run(p);
            let above = match floor {
                Some(f) if runs > 0.0 => format!("{:.1}", ns - f),
                _ => "-".into(),
            };
            println!(
                "| {} | {} | {runs} | {ns:.1} | {above} |",
                p["tracepoint"].as_str().unwrap_or("?"),
                p["program"].as_str().unwrap_or("?"),
            );
        }
        println!();
    }
    Ok(())
}

/// Events per second delivered in deep-dive mode on a syscall storm, and events lost.
fn deep_dive_throughput() -> Result<()> {
    println!("### Deep-dive throughput (syscall-storm workload, 5 s)\n");
    println!("| run | events | events/s | lost |\n|---|---:|---:|---:|");
    for run in 1..=3 {
        let (child, _out, info) = start_workload(&["syscall-storm", "--threads", "1"])?;
        let r = probe_json(
            info["pid"].as_u64().unwrap(),
            &["--duration", "5s", "--deep-dive"],
        )?;
        stop(child);
        let d = &r["deep_dive"];
        println!(
            "| {run} | {} | {:.0} | {} |",
            d["events"]["total"],
            d["events_per_sec"].as_f64().unwrap(),
            r["lost_events"]
        );
    }
    println!();
    Ok(())
}

/// Throughput of the pingpong workload with and without the sentinel probes attached,
/// A/B interleaved in one run.
fn overhead_ratio() -> Result<()> {
    println!("### Overhead on a context-switch-heavy workload (pingpong, A/B interleaved)\n");
    println!(
        "| pair | without (trips/s) | with sentinel (trips/s) | ratio |\n|---|---:|---:|---:|"
    );
    let mut ratios = Vec::new();
    for pair in 1..=5 {
        let mut rates = [0.0; 2];
        for (i, attach) in [false, true].into_iter().enumerate() {
            let (child, mut out, info) =
                start_workload(&["pingpong", "--seconds", "3", "--warmup", "1.5"])?;
            let probe = attach
                .then(|| {
                    Command::new(crate::stallscope_bin())
                        .args([
                            "probe",
                            "--pid",
                            &info["pid"].to_string(),
                            "--duration",
                            "6s",
                        ])
                        .env("RUST_LOG", "warn")
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .spawn()
                })
                .transpose()?;
            let mut line = String::new();
            out.read_line(&mut line)?;
            let v: Value = serde_json::from_str(&line)?;
            rates[i] = v["round_trips_per_sec"].as_f64().unwrap();
            stop(child);
            if let Some(p) = probe {
                stop(p);
            }
            sleep(Duration::from_millis(200));
        }
        let ratio = rates[1] / rates[0];
        ratios.push(ratio);
        println!(
            "| {pair} | {:.0} | {:.0} | {:.3} |",
            rates[0], rates[1], ratio
        );
    }
    ratios.sort_by(f64::total_cmp);
    println!(
        "\nmedian throughput ratio with/without: {:.3}\n",
        ratios[ratios.len() / 2]
    );
    Ok(())
}
