//! The sentinel on the GPU loop: `stallscope run` watching the loop's `step`, its per-iteration
//! GPU figures, a steady window, then each GPU injector with the slowdown the loop's own step
//! times show and the alert it raises, the alert's deep dive (GPU tracks, NVML counters), and
//! what the daemon's exit leaves behind.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use sys_util::clock::monotonic_ns;

use super::decode_loop::{median, DecodeLoop};

/// The loop's healthy window, checked for alerts.
const STEADY: Duration = Duration::from_secs(20);
/// Each injection (the injector's own torch import comes out of it).
const INJECTION: Duration = Duration::from_secs(12);
/// GPU injectors, in order.
const SCENARIOS: [&str; 2] = ["gemm-contention", "pcie-saturation"];

/// The daemon's answer to `GET path` (empty when it did not answer).
fn http(port: u16, path: &str) -> String {
    sys_util::http::get(port, path, Duration::from_secs(10))
        .map(|r| r.body)
        .unwrap_or_default()
}

fn json_at(port: u16, path: &str) -> Value {
    serde_json::from_str(&http(port, path)).unwrap_or(Value::Null)
}

/// A metric's value summed over its series (Prometheus text).
fn metric(text: &str, name: &str) -> Option<f64> {
    let v: Vec<f64> = text
        .lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|r| r.starts_with(' ') || r.starts_with('{'))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    (!v.is_empty()).then(|| v.iter().sum())
}

/// The settings laid over the embedded default (`stallscope run --config` takes only the keys
/// it changes): the loop by pid, its `step` the only watch, a deep dive for each alert.
fn config(dir: &Path, pid: u32, port: u16) -> Result<PathBuf> {
    let text = format!(
        r#"[watch]
pids = [{pid}]
process_patterns = []

[sentinel]
engine_patterns = []
framework = "generic"
watch = ["__main__:step[batch=batch;context_tokens=n]"]

[deep_dive]
reference_settle = "2s"
cooldown = "10s"
dir = "{dir}/deep-dives"

[http]
listen = "127.0.0.1:{port}"

[state]
dir = "{dir}"
iterations_csv = "{dir}/iterations.csv"
"#,
        dir = dir.display()
    );
    let cfg = dir.join("config.toml");
    std::fs::write(&cfg, text)?;
    Ok(cfg)
}

struct Daemon {
    child: Child,
    port: u16,
}

impl Daemon {
    fn engine(&self) -> Value {
        json_at(self.port, "/api/v1/status")["engines"][0].clone()
    }

    fn wait(&self, what: &str, limit: Duration, ok: impl Fn(&Value) -> bool) -> Result<Value> {
        let t = Instant::now();
        loop {
            let e = self.engine();
            if ok(&e) {
                eprintln!(
                    "gpu-check: sentinel: {what} after {:.1} s",
                    t.elapsed().as_secs_f64()
                );
                return Ok(e);
            }
            if t.elapsed() > limit {
                bail!("sentinel: no {what} within {limit:?}: {e}");
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Alerts whose triggering iteration ended in `[a, b]` (CLOCK_MONOTONIC ns).
fn alerts_between(port: u16, a: u64, b: u64) -> Vec<Value> {
    json_at(port, "/api/v1/alerts")
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|x| {
            x["trigger_iteration_end_ns"]
                .as_u64()
                .is_some_and(|t| (a..=b).contains(&t))
        })
        .collect()
}

/// The slowdown the loop's own steps show in `[a, b]` against `normal` (ns): over the whole
/// window, and the worst 1 s in it.
fn slowdown(target: &DecodeLoop, a: u64, b: u64, normal: u64) -> Value {
    let whole = median(&target.steps_between(a, b)).map(|m| m as f64 / normal as f64);
    let worst = (a..b)
        .step_by(1_000_000_000)
        .filter_map(|s| median(&target.steps_between(s, s + 1_000_000_000)))
        .max()
        .map(|m| m as f64 / normal as f64);
    json!({"median_step_x": whole, "worst_second_x": worst})
}

/// Runs the phase; the daemon's log, state and deep dives go under `dir`.
/// `gpu`: whether GPU figures are expected (not on a CPU try of the harness).
pub fn run(
    bin: &Path,
    target: &mut DecodeLoop,
    dir: &Path,
    python: &str,
    gpu: bool,
) -> Result<Value> {
    let mut report = json!({});
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let cfg = config(dir, target.pid, port)?;
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let before = target.footprint();
    let daemon = Daemon {
        child: Command::new(bin)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("cannot start stallscope run")?,
        port,
    };
    daemon.wait("anchor on __main__:step", Duration::from_secs(60), |e| {
        e["anchor"] == "__main__:step"
    })?;
    let fitted = daemon.wait("fitted model", Duration::from_secs(180), |e| {
        e["model_state"] == "fitted" && (!gpu || e["gpu_iterations"].as_u64().unwrap_or(0) >= 200)
    })?;
    report["fitted"] = fitted;
    let pid_key = target.pid.to_string();
    let reference = (|| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            let r = json_at(port, "/api/v1/status")["normal_references"][&pid_key].clone();
            if !r.is_null() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        Value::Null
    })();
    report["normal_reference"] = reference;

    // Steady: no alert unless the loop's own steps slowed by the alert's threshold.
    let a = monotonic_ns();
    std::thread::sleep(STEADY);
    let b = monotonic_ns();
    let steady_steps = target.steps_between(a, b);
    let normal = median(&steady_steps).context("no steps in the steady window")?;
    let steady_alerts = alerts_between(port, a, b);
    report["steady"] = json!({
        "seconds": STEADY.as_secs(),
        "steps": steady_steps.len(),
        "median_step_us": normal as f64 / 1e3,
        "alerts": steady_alerts,
        "worst_second_x": slowdown(target, a, b, normal)["worst_second_x"],
        "engine": daemon.engine(),
    });
    let m = http(port, "/metrics");
    let mean = |n: &str| {
        metric(&m, &format!("{n}_sum"))
            .zip(metric(&m, &format!("{n}_count")))
            .map(|(s, c)| json!({"mean": s / c, "count": c}))
    };
    report["gpu_figures"] = json!({
        "iteration_gpu_busy_seconds": mean("stallscope_iteration_gpu_busy_seconds"),
        "iteration_gpu_void_ratio": mean("stallscope_iteration_gpu_void_ratio"),
        "gpu_launch_latency_seconds": mean("stallscope_gpu_launch_latency_seconds"),
        "iteration_seconds": mean("stallscope_iteration_duration_seconds"),
        "status_gpu_void_ratio": daemon.engine()["gpu_void_ratio"],
        "status_gpu_plane": daemon.engine()["gpu_plane"],
    });

    let mut injections = Vec::new();
    for sc in SCENARIOS {
        // Each injection starts with no alert open.
        let _ = daemon.wait("no open alert", Duration::from_secs(60), |e| {
            e["anomaly_active"] == false
        });
        std::thread::sleep(Duration::from_secs(3));
        let a = monotonic_ns();
        let out = Command::new(bin)
            .args(["inject", sc, "--pid", &target.pid.to_string(), "--json"])
            .args(["--intensity", "1.0", "--duration"])
            .arg(format!("{}s", INJECTION.as_secs()))
            .env("STALLSCOPE_GPU_PYTHON", python)
            .output()?;
        let b = monotonic_ns();
        std::thread::sleep(Duration::from_secs(2));
        let alerts = alerts_between(port, a, b + 2_000_000_000);
        let slow = slowdown(target, a, b, normal);
        eprintln!(
            "gpu-check: {sc}: {} alert(s), loop slowed {slow}",
            alerts.len()
        );
        injections.push(json!({
            "scenario": sc,
            "injector_ok": out.status.success(),
            "injector": String::from_utf8_lossy(&out.stdout).trim(),
            "injector_stderr": String::from_utf8_lossy(&out.stderr).trim(),
            "seconds": (b - a) as f64 / 1e9,
            "slowdown": slow,
            "alerts": alerts,
            "detected": !alerts.is_empty(),
        }));
    }
    report["injections"] = Value::Array(injections);

    // The deep dive of the first injection's first alert (on_alert), once written.
    let trigger = report["injections"][0]["alerts"][0]["id"]
        .as_u64()
        .map(|id| format!("alert {id}"));
    let t = Instant::now();
    let dive = loop {
        let dives = json_at(port, "/api/v1/deep-dives");
        let done = dives.as_array().and_then(|d| {
            d.iter()
                .filter(|x| x["state"] == "done")
                .find(|x| trigger.as_deref().is_none_or(|t| x["trigger"] == t))
                .cloned()
        });
        if done.is_some() || t.elapsed() > Duration::from_secs(60) {
            break done.unwrap_or(dives);
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    report["deep_dive"] = match dive["trace"].as_str() {
        Some(trace) => {
            json!({"record": dive, "trace": super::trace_facts(Path::new(trace), target.pid)})
        }
        None => json!({"record": dive, "error": "no deep dive was written"}),
    };
    report["final_engine"] = daemon.engine();

    // SIGTERM: the daemon removes its probes and the GPU agent.
    let mut daemon = daemon;
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(daemon.child.id() as i32, libc::SIGTERM) };
    let exit = daemon.child.wait()?;
    std::thread::sleep(Duration::from_millis(500));
    let after = target.footprint();
    report["daemon_exit"] = json!(exit.code());
    report["footprint_before"] = before.json();
    report["footprint_after"] = after.json();
    report["clean_exit"] = json!(exit.success() && after.clean());
    Ok(report)
}
