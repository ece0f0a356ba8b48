//! `stallscope evaluate --steady DURATION`: false alerts under healthy load. The daemon runs
//! with the embedded default configuration as shipped (refits, recalibration, the alert rule),
//! only its state moved; after its first fit, DURATION of steady load without injection. Each
//! alert is then judged by the engine's own log: it is explained when vLLM's steps were slower
//! than usual by at least the alert's threshold (an alert at UCL 0.15 needs steps
//! 1/(1 − 0.15) = 1.18 times their usual time) by any measure of the engine's: over the window
//! that opened it (the iterations that ended within the rule's window before its start, each
//! found in the log, [`Pace::iterations`]: the rule asserts that every window of its
//! persistence ran over the threshold, this one among them), or over the whole seconds from
//! the window and persistence before it to its end ([`Judged`]); otherwise it is false. Writes
//! steady.json and steady.md.

use std::{fmt::Write as _, path::Path, time::Duration};

use anyhow::{Context, Result};
use log::info;
use model::detector::Span;
use serde_json::{json, Value};

use super::{
    api, free_port,
    load::Load,
    report,
    slowdown::{EngineLog, Exported, Pace},
    start_daemon, unix_us, wait_fitted, with_state, EvaluateArgs,
};
use crate::config::DEFAULT_CONFIG;

/// A span of the rule in time; counted in iterations, a generous second.
fn span_us(s: Span) -> f64 {
    match s {
        Span::Micros(us) => us as f64,
        Span::Iterations(_) => 1e6,
    }
}

/// Rows of the export read around a judged span, before and after it, µs: enough prefills
/// among them to place the rows in the log.
const AROUND_US: (f64, f64) = (5e6, 2e6);

/// vLLM's own pace over the iterations that ended in `[from_us, to_us)` (an alert's window);
/// `rows` in export order, which is the order of their ends (one engine's iterations do not
/// overlap).
fn raised_by(pace: &Pace, rows: &[Exported], from_us: f64, to_us: f64) -> Option<f64> {
    let a = rows.partition_point(|r| r.end_us < from_us - AROUND_US.0);
    let b = rows.partition_point(|r| r.end_us < to_us + AROUND_US.1);
    pace.iterations(&rows[a..b], from_us, to_us)
}

pub fn run(
    args: &EvaluateArgs,
    duration: Duration,
    engine_pid: u64,
    api_port: u16,
    engine_log: &Path,
    state: &Path,
) -> Result<()> {
    let load = Load::start(api_port, 8, args.seed)?;
    let port = free_port()?;
    let config = with_state(DEFAULT_CONFIG, state, port);
    let daemon = start_daemon(state, &config)?;
    let fitted = wait_fitted(port, engine_pid, args.fit_timeout, state)?;
    info!(
        "baseline fitted (UCL {:.3}); {duration:?} of steady load",
        fitted["ucl"].as_f64().unwrap_or(f64::NAN)
    );
    let from_us = unix_us();
    let step = Duration::from_secs(60).min(duration);
    let mut waited = Duration::ZERO;
    while waited < duration {
        let d = step.min(duration - waited);
        std::thread::sleep(d);
        waited += d;
        let alerts = api(port, "GET", "/api/v1/alerts", "")
            .map(|(_, v)| v.as_array().map_or(0, Vec::len))
            .unwrap_or(0);
        info!("{waited:?} of {duration:?}: {alerts} alerts since the daemon started");
    }
    let to_us = unix_us();
    let (_, alerts) = api(port, "GET", "/api/v1/alerts", "")?;
    let (_, status) = api(port, "GET", "/api/v1/status", "")?;
    let _ = daemon.stop(Duration::from_secs(30));
    drop(load);

    let detector = crate::config::Config::parse(&config, "steady")?
        .sentinel
        .params()
        .detector;
    let log = EngineLog::read(engine_log, (to_us / 1e6) as i64)?;
    let pace = log.pace(from_us, to_us);
    // Every row of the export, each with its start and whether it was a decode iteration:
    // the decode ones in the window are counted, and all of them are looked for in the log.
    let export = report::read_export(
        &state.join("iterations.csv"),
        [
            "start_ts",
            "duration_us",
            "batch_size",
            "num_tokens",
            "stage",
        ],
        |[start, dur, batch, tokens, stage]| {
            let start_us = start.parse::<f64>().ok()?;
            let row = Exported {
                end_us: start_us + dur.parse::<f64>().ok()?,
                batch: batch.parse().ok()?,
                tokens: tokens.parse().ok()?,
            };
            Some((row, start_us, stage == "decode"))
        },
    )?;
    let decode = export
        .iter()
        .filter(|(r, start_us, decode)| *decode && *start_us >= from_us && r.end_us <= to_us)
        .count();
    let rows: Vec<Exported> = export.into_iter().map(|(r, ..)| r).collect();
    // How long before an alert's start its slow iterations began: the rule's window and
    // persistence, at most.
    let lead_in = span_us(detector.window) + span_us(detector.start_after);
    let window = span_us(detector.window);
    let mut judged = Vec::new();
    for a in alerts.as_array().context("/api/v1/alerts is not a list")? {
        let started = a["started_unix_ms"].as_f64().unwrap_or(0.0) * 1e3;
        if !(from_us..to_us).contains(&started) {
            continue;
        }
        let ended = a["ended_unix_ms"].as_f64().map_or(to_us, |e| e * 1e3);
        let threshold = detector.threshold(a["ucl"].as_f64().unwrap_or(0.0));
        let needed = model::baseline::slowdown_of_error(threshold);
        let j = pace.judge(started - lead_in, ended);
        let raised_by = raised_by(&pace, &rows, started - window, started);
        let explained = [raised_by, j.elapsed, j.period]
            .into_iter()
            .flatten()
            .any(|x| x >= needed);
        judged.push(json!({
            "alert": a,
            "needed_slowdown": needed,
            "engine": j,
            "engine_raised_by": raised_by,
            "explained": explained,
        }));
    }
    let false_alerts = judged.iter().filter(|j| j["explained"] == false).count();
    let flagged: u64 = judged
        .iter()
        .filter_map(|j| j["alert"]["iterations"].as_u64())
        .sum();
    let engine = status["engines"]
        .as_array()
        .and_then(|e| e.iter().find(|e| e["pid"] == engine_pid))
        .cloned()
        .unwrap_or(Value::Null);
    let out = json!({
        "seed": args.seed,
        "duration_s": (to_us - from_us) / 1e6,
        "decode_iterations": decode,
        "alerts": judged.len(),
        "false_alerts": false_alerts,
        "flagged_iterations": flagged,
        "usual_decode_period_ms": pace.usual_period(),
        "engine_at_end": engine,
        "judged": judged,
    });
    std::fs::write(
        args.out.join("steady.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    let md = markdown(&out);
    std::fs::write(args.out.join("steady.md"), &md)?;
    print!("{md}");
    Ok(())
}

fn markdown(out: &Value) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Steady load on vLLM ({:.0} s after the first fit, seed {})\n",
        out["duration_s"].as_f64().unwrap_or(0.0),
        out["seed"]
    );
    let _ = writeln!(
        s,
        "{} decode iterations; {} alerts, {} false (the engine's own steps did not slow by the alert's threshold); {} iterations in alerts. The model at the end: UCL {}, {} samples, recalibration {}.\n",
        out["decode_iterations"],
        out["alerts"],
        out["false_alerts"],
        out["flagged_iterations"],
        out["engine_at_end"]["ucl"],
        out["engine_at_end"]["model_samples"],
        out["engine_at_end"]["recalibration"]
    );
    let judged = out["judged"].as_array().cloned().unwrap_or_default();
    if !judged.is_empty() {
        let _ = writeln!(s, "| Alert | Started (unix ms) | Iterations | Slowdown (stallscope) | Needed | vLLM, the window that opened it / usual | vLLM elapsed / usual, whole seconds | vLLM decode period / usual | Verdict |");
        let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|---|");
        let f = |v: &Value| v.as_f64().map_or("-".into(), |x| format!("{x:.2}"));
        for j in judged {
            let a = &j["alert"];
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                a["id"],
                a["started_unix_ms"],
                a["iterations"],
                f(&a["slowdown"]),
                f(&j["needed_slowdown"]),
                f(&j["engine_raised_by"]),
                f(&j["engine"]["elapsed"]),
                f(&j["engine"]["period"]),
                if j["explained"] == true {
                    "explained"
                } else {
                    "false"
                }
            );
        }
    }
    s
}
