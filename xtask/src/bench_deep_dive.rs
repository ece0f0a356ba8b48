//! `cargo xtask bench --only deep-dive`: vLLM's throughput while the daemon takes a deep dive,
//! against the same daemon with none running (A/B interleaved, one run), and what each deep
//! dive captured. Needs `cargo xtask vllm up` first.

use std::{
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Pairs of load windows.
const PAIRS: usize = 6;
/// Seconds of load per window.
const WINDOW_S: f64 = 10.0;
/// The daemon's HTTP port in this bench.
const PORT: u16 = 9478;

fn http(method: &str, path: &str, body: &str) -> Result<(u16, Value)> {
    let r = sys_util::http::request(PORT, method, path, "", body, Duration::from_secs(60))?;
    Ok((
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    ))
}

/// A load window of WINDOW_S seconds; output tokens per second.
fn load(port: u16, seed: usize) -> Result<f64> {
    let out = Command::new(crate::root().join("target/release/xtask"))
        .args(["vllm", "load", "--duration", &WINDOW_S.to_string()])
        .args(["--concurrency", "8", "--port", &port.to_string()])
        .args(["--seed", &seed.to_string()])
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("load run failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(text.lines().last().context("no load summary")?)?;
    v["output_tokens_per_s"].as_f64().context("no throughput")
}

pub fn run() -> Result<()> {
    let Some(server) = crate::bench_sentinel::server_state()? else {
        println!("\n(deep-dive bench skipped: no server; run `cargo xtask vllm up` first)");
        return Ok(());
    };
    let (engine, api) = (
        server["engine_pid"].as_u64().context("engine_pid")?,
        server["port"].as_u64().unwrap_or(8000) as u16,
    );
    let dir = std::env::temp_dir().join("stallscope-bench-deep-dive");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // Deep dives only on request, bounded generously so the whole window is captured.
    let cfg = include_str!("../../probe-user/config/default.toml")
        .replace(
            "listen = \"127.0.0.1:9464\"",
            &format!("listen = \"127.0.0.1:{PORT}\""),
        )
        .replace(
            "dir = \"/var/lib/stallscope\"",
            &format!("dir = \"{}\"", dir.display()),
        )
        .replace("on_alert = true", "on_alert = false")
        .replace("max_per_hour = 6", "max_per_hour = 100")
        .replace("reference_every = \"10m\"", "reference_every = \"1000h\"")
        .replace("max_events = 2000000", "max_events = 40000000")
        .replace("max_bytes = 268435456", "max_bytes = 4294967296");
    std::fs::write(dir.join("config.toml"), cfg)?;
    let mut daemon = Command::new(crate::stallscope_bin())
        .args(["run", "--config"])
        .arg(dir.join("config.toml"))
        .stderr(std::fs::File::create(dir.join("daemon.log"))?)
        .spawn()?;
    let result = (|| -> Result<()> {
        // Attach (it needs a busy engine) and warm up.
        let t = Instant::now();
        loop {
            load(api, 1)?;
            let (_, s) = http("GET", "/api/v1/status", "").unwrap_or_default();
            if s["engines"].as_array().is_some_and(|e| !e.is_empty()) {
                break;
            }
            if t.elapsed() > Duration::from_secs(300) {
                bail!("the daemon did not attach to the engine");
            }
        }
        let (mut off, mut on, mut dives) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..PAIRS {
            let mut arm = |with: bool| -> Result<()> {
                let seed = 100 + 2 * i + usize::from(with);
                if !with {
                    off.push(load(api, seed)?);
                    return Ok(());
                }
                let body = format!(r#"{{"pid": {engine}, "duration_s": {}}}"#, WINDOW_S + 1.0);
                let (code, v) = http("POST", "/api/v1/deep-dive", &body)?;
                if code != 202 {
                    bail!("deep dive refused ({code}): {v}");
                }
                on.push(load(api, seed)?);
                let id = v["id"].as_u64().context("no id")?;
                let t = Instant::now();
                loop {
                    let (_, r) = http("GET", &format!("/api/v1/deep-dives/{id}"), "")?;
                    match r["state"].as_str() {
                        Some("done") => {
                            let report: Value = serde_json::from_slice(&std::fs::read(
                                r["report"].as_str().context("no report")?,
                            )?)?;
                            dives.push(report);
                            break;
                        }
                        Some("failed") => bail!("deep dive failed: {r}"),
                        _ if t.elapsed() > Duration::from_secs(300) => bail!("deep dive hung"),
                        _ => std::thread::sleep(Duration::from_millis(500)),
                    }
                }
                Ok(())
            };
            // Alternate which arm goes first.
            arm(i % 2 == 1)?;
            arm(i % 2 == 0)?;
        }
        println!("\n## Deep dive on vLLM (cargo xtask bench --only deep-dive)\n");
        println!("| pair | without tok/s | during a deep dive tok/s | ratio | kernel events | trace MB | bytes/event | first event after trigger |");
        println!("|---|---:|---:|---:|---:|---:|---:|---:|");
        let mut ratios = Vec::new();
        for (i, ((a, b), d)) in off.iter().zip(&on).zip(&dives).enumerate() {
            ratios.push(b / a);
            let w = &d["written"];
            println!(
                "| {} | {a:.1} | {b:.1} | {:.4} | {} | {:.1} | {:.1} | {:.1} ms |",
                i + 1,
                b / a,
                d["kernel_events"],
                w["bytes"].as_f64().unwrap_or(0.0) / 1e6,
                w["bytes"].as_f64().unwrap_or(0.0) / w["events"].as_f64().unwrap_or(1.0),
                d["first_event_after_trigger_ms"]
                    .as_f64()
                    .unwrap_or(f64::NAN)
            );
        }
        ratios.sort_by(f64::total_cmp);
        let mean = ratios.iter().sum::<f64>() / ratios.len() as f64;
        println!(
            "median throughput ratio (during / without) {:.4}, mean {mean:.4}, range {:.4}..{:.4}",
            ratios[ratios.len() / 2],
            ratios[0],
            ratios[ratios.len() - 1]
        );
        Ok(())
    })();
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let _ = daemon.wait();
    result
}
