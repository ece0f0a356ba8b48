//! `stallscope evaluate`: detection scoring on a running engine (vLLM). Drives load on its
//! OpenAI-compatible endpoint, runs the daemon until its baseline is fitted, then runs each
//! scenario N times with a seeded random start, span and severity, and scores every modelled
//! iteration against the injection intervals for the strategies of LatencyPrism's Table 5.
//! Writes trials.csv, scores.json, table.md and heatmap.png.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use log::{info, warn};
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::{json, Value};

use sys_util::{http, process::Group};

use self::{load::Load, report::write_outputs};
use crate::config::DEFAULT_CONFIG;

mod heatmap;
mod load;
mod report;
mod rescore;
mod slowdown;
mod steady;

/// Scenarios run by default: the CPU-side ones that need nothing the host may lack.
const DEFAULT_SCENARIOS: &str = "cpu-contention,cpu-frequency,memory-pressure,memory-fragmentation,io-contention,python-gc-storm,python-sync-stall,process-pause";
/// Length of a deep dive taken during an injection (`--deep-dives`).
pub const DEEP_DIVE_WINDOW: f64 = 2.0;

/// Options of `stallscope evaluate`.
#[derive(Debug, Clone, clap::Args)]
pub struct EvaluateArgs {
    /// Scenarios to run, comma-separated (see `stallscope inject --list`).
    #[arg(long, default_value = DEFAULT_SCENARIOS)]
    pub scenarios: String,
    /// Trials per scenario.
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// Seed of the injection starts, spans and severities.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output directory (trials.csv, scores.json, table.md, heatmap.png, state/).
    #[arg(long, default_value = "evaluation")]
    pub out: PathBuf,
    /// The engine, as `cargo xtask vllm up` prints it: {"engine_pid", "port", ...}.
    #[arg(long, conflicts_with_all = ["pid", "url"])]
    pub vllm: Option<String>,
    /// The engine's process (vLLM's `VLLM::EngineCore`); with --url.
    #[arg(long, requires = "url")]
    pub pid: Option<u32>,
    /// The engine's OpenAI-compatible endpoint on this host, `http://127.0.0.1:PORT`; with
    /// --pid.
    #[arg(long, requires = "pid")]
    pub url: Option<String>,
    /// Also take a deep dive during each injection and score the root cause's top-1.
    #[arg(long)]
    pub deep_dives: bool,
    /// Longest wait for the baseline to be fitted.
    #[arg(long, default_value = "15m", value_parser = humantime::parse_duration)]
    pub fit_timeout: Duration,
    /// Each injection's length, in the engine's own decode steps (`FROM..TO`, drawn per
    /// trial; the step is the median of the last 500 decode iterations once the baseline is
    /// fitted): the same evaluation on a 20 ms and a 150 ms engine. 80..160 is 2-4 s at 25 ms.
    #[arg(long, default_value = "80..160", value_parser = steps)]
    pub span_steps: (f64, f64),
    /// Healthy time before each injection, in decode steps likewise (120..200: 3-5 s at 25 ms).
    #[arg(long, default_value = "120..200", value_parser = steps)]
    pub lead_steps: (f64, f64),
    /// Each injection's intensity, drawn per trial from `FROM..TO` within (0, 1]. A wide
    /// range (0.1..1.0) calibrates the scenarios: the tables give the engine's slowdown at
    /// each intensity.
    #[arg(long, default_value = "0.5..1.0", value_parser = intensities)]
    pub intensity: (f64, f64),
    /// Recovery grace, in decode steps: the iterations that start this soon after an
    /// injection ends are in neither class in the tables "with grace" (the engine and a
    /// moving mean take a moment to recover).
    #[arg(long, default_value_t = 40.0)]
    pub grace_steps: f64,
    /// Instead of injecting, run the daemon as configured by default for this long of steady
    /// load after its first fit and judge each alert by the engine's own log (steady.json,
    /// steady.md): the false-alert measure.
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "deep_dives")]
    pub steady: Option<Duration>,
    /// The engine's log with vLLM's iteration lines (`--enable-logging-iteration-details`),
    /// to measure each injection's slowdown by the engine's own clock (with --vllm: its
    /// "log").
    #[arg(long)]
    pub engine_log: Option<PathBuf>,
    /// Inject nothing: score an earlier run again from its --out directory (its trials.csv,
    /// scores.json and state/), rewriting its tables, e.g. after a change to the scoring or
    /// with another --grace-steps. The run's own seed, trials and ranges are used.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["vllm", "pid", "url", "steady", "out"])]
    pub rescore: Option<PathBuf>,
}

/// `FROM..TO` intensities, 0 < FROM <= TO <= 1.
fn intensities(s: &str) -> Result<(f64, f64), String> {
    range(s, "intensities", "0.5..1.0", |a, b| {
        0.0 < a && a <= b && b <= 1.0
    })
    .map_err(|e| e.unwrap_or_else(|| format!("{s:?}: expected 0 < FROM <= TO <= 1")))
}

/// `FROM..TO` decode steps, 1 <= FROM <= TO.
fn steps(s: &str) -> Result<(f64, f64), String> {
    range(s, "decode steps", "80..160", |a, b| {
        1.0 <= a && a <= b && b.is_finite()
    })
    .map_err(|e| e.unwrap_or_else(|| format!("{s:?}: expected 1 <= FROM <= TO")))
}

/// `FROM..TO` of `what` (such as `example`) that pass `valid`; the error says why, or None
/// when the numbers are out of range.
fn range(
    s: &str,
    what: &str,
    example: &str,
    valid: impl Fn(f64, f64) -> bool,
) -> Result<(f64, f64), Option<String>> {
    let (a, b) = s.split_once("..").ok_or_else(|| {
        Some(format!(
            "{s:?}: expected FROM..TO {what}, such as {example}"
        ))
    })?;
    let parse = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| Some(format!("{s:?}: {x:?} is not a number")))
    };
    let (a, b) = (parse(a)?, parse(b)?);
    valid(a, b).then_some((a, b)).ok_or(None)
}

/// The engine's decode step now: the median of the last 500 decode iterations exported.
fn engine_step(export: &Path) -> Result<Duration> {
    let its = report::read_iterations(export)?;
    let mut last: Vec<f64> = its.iter().rev().take(500).map(|i| i.duration_us).collect();
    if last.len() < 50 {
        bail!(
            "only {} decode iterations in {} once the baseline was fitted: cannot measure the engine's step",
            last.len(),
            export.display()
        );
    }
    last.sort_by(f64::total_cmp);
    Ok(Duration::from_secs_f64(last[last.len() / 2] / 1e6))
}

/// One trial's plan and outcome.
#[derive(Debug, Clone, Serialize)]
struct TrialRecord {
    scenario: String,
    trial: usize,
    intensity: f64,
    from_us: f64,
    inject_from_us: f64,
    inject_to_us: f64,
    to_us: f64,
    /// The injector's setup before its stress took hold (before the labelled interval), ms.
    setup_ms: Option<f64>,
    mechanism: String,
    /// The daemon's id of the deep dive taken during the injection.
    deep_dive: Option<u64>,
    root_cause: Option<String>,
    /// The engine's slowdown by its own log (see [`slowdown`]).
    slowdown: Option<slowdown::Slowdown>,
}

/// GET or POST on the daemon's loopback API: the status and the JSON body (null if none).
fn api(port: u16, method: &str, path: &str, body: &str) -> Result<(u16, Value)> {
    let r = http::request(port, method, path, "", body, Duration::from_secs(60))?;
    Ok((
        r.status,
        serde_json::from_str(&r.body).unwrap_or(Value::Null),
    ))
}

fn engine_status(port: u16, pid: u64) -> Option<Value> {
    let (_, s) = api(port, "GET", "/api/v1/status", "").ok()?;
    s["engines"]
        .as_array()?
        .iter()
        .find(|e| e["pid"] == pid)
        .cloned()
}

/// Whether the daemon holds a normal reference of engine `pid` (its status lists it).
fn has_reference(port: u16, pid: u64) -> bool {
    api(port, "GET", "/api/v1/status", "")
        .ok()
        .is_some_and(|(_, s)| !s["normal_references"][pid.to_string()].is_null())
}

/// The CPUs of the most pinned process of the engine's tree (where the forward pass runs;
/// vLLM pins its worker).
fn forward_cpus(pid: u32) -> Vec<usize> {
    anomaly_suite::process_tree(pid)
        .into_iter()
        .map(|p| anomaly_suite::allowed_cpus(Some(p)))
        .min_by_key(Vec::len)
        .unwrap_or_default()
}

/// Runs the evaluation.
pub fn run(args: &EvaluateArgs) -> Result<()> {
    let scenarios: Vec<&anomaly_suite::Scenario> = args
        .scenarios
        .split(',')
        .map(|s| anomaly_suite::scenario(s.trim()))
        .collect::<Result<_>>()?;
    if args.grace_steps.is_nan() || args.grace_steps < 0.0 {
        bail!("--grace-steps must be 0 or more decode steps");
    }
    if let Some(dir) = &args.rescore {
        return rescore::run(args, dir);
    }
    if args.trials == 0 {
        bail!("--trials must be at least 1");
    }
    let state = args.out.join("state");
    std::fs::create_dir_all(&state)
        .with_context(|| format!("cannot create {}", state.display()))?;
    let (engine_pid, api_port, log) = engine(args)?;
    if let Some(duration) = args.steady {
        let log = log.context(
            "--steady judges alerts by the engine's own log: give it with --engine-log (vLLM started with --enable-logging-iteration-details)",
        )?;
        return steady::run(args, duration, engine_pid, api_port, &log, &state);
    }
    if log.is_none() {
        warn!("no engine log (--engine-log): the injections' slowdowns will not be measured");
    }
    evaluate(
        args,
        &scenarios,
        engine_pid,
        api_port,
        log.as_deref(),
        &state,
    )
}

/// The engine's pid, the loopback port of its OpenAI-compatible endpoint and its log.
fn engine(args: &EvaluateArgs) -> Result<(u64, u16, Option<PathBuf>)> {
    if let Some(s) = &args.vllm {
        let v: Value = serde_json::from_str(s)
            .context("--vllm must be the JSON `cargo xtask vllm up` prints")?;
        let pid = v["engine_pid"]
            .as_u64()
            .context("the --vllm JSON has no engine_pid")?;
        let port = v["port"]
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .context("the --vllm JSON has no port")?;
        let log = args.engine_log.clone().or_else(|| {
            v["log"]
                .as_str()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
        });
        return Ok((pid, port, log));
    }
    let (Some(pid), Some(url)) = (args.pid, &args.url) else {
        bail!("give the engine: --vllm JSON, or --pid PID with --url http://127.0.0.1:PORT");
    };
    let port = ["http://127.0.0.1:", "http://localhost:"]
        .iter()
        .find_map(|p| url.strip_prefix(p))
        .and_then(|rest| rest.trim_end_matches('/').parse::<u16>().ok())
        .with_context(|| {
            format!("--url {url}: give the engine's endpoint on this host as http://127.0.0.1:PORT (evaluate runs next to the engine)")
        })?;
    Ok((u64::from(pid), port, args.engine_log.clone()))
}

fn evaluate(
    args: &EvaluateArgs,
    scenarios: &[&anomaly_suite::Scenario],
    engine_pid: u64,
    api_port: u16,
    engine_log: Option<&Path>,
    state: &Path,
) -> Result<()> {
    if !Path::new(&format!("/proc/{engine_pid}")).exists() {
        bail!("no process with pid {engine_pid}: give the engine's pid (vLLM's VLLM::EngineCore)");
    }
    let load = Load::start(api_port, 8, args.seed)?;
    let port = free_port()?;
    let config = evaluation_config(state, port, args.deep_dives);
    let daemon = start_daemon(state, &config)?;
    let fitted = wait_fitted(port, engine_pid, args.fit_timeout, state)?;
    let ucl = fitted["ucl"].as_f64().context("no UCL in the status")?;
    info!(
        "baseline fitted (UCL {ucl:.3}); {} scenarios × {} trials",
        scenarios.len(),
        args.trials
    );
    // Settle, and with deep dives let the first normal reference be recorded (the trials'
    // root causes are ranked against it).
    std::thread::sleep(Duration::from_secs(10));
    if args.deep_dives {
        let t = std::time::Instant::now();
        while !has_reference(port, engine_pid) {
            if t.elapsed() > REFERENCE_WAIT {
                warn!(
                    "no normal reference within {REFERENCE_WAIT:?} of the fit (see {}): the deep dives will have nothing to compare with",
                    state.join("daemon.log").display()
                );
                break;
            }
            std::thread::sleep(Duration::from_secs(1));
        }
    }
    let step = engine_step(&state.join("iterations.csv"))?;
    info!(
        "engine decode step {:.1} ms: injections of {:.0}..{:.0} steps ({:.1}..{:.1} s)",
        step.as_secs_f64() * 1e3,
        args.span_steps.0,
        args.span_steps.1,
        step.as_secs_f64() * args.span_steps.0,
        step.as_secs_f64() * args.span_steps.1
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let exe_s = std::env::current_exe()?.display().to_string();
    let cpus = forward_cpus(engine_pid as u32)
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",");
    let mut records = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    for s in scenarios {
        for trial in 0..args.trials {
            let lead = step.mul_f64(rng.random_range(args.lead_steps.0..=args.lead_steps.1));
            let span = step.mul_f64(rng.random_range(args.span_steps.0..=args.span_steps.1));
            let intensity: f64 = rng.random_range(args.intensity.0..=args.intensity.1);
            let from_us = unix_us();
            std::thread::sleep(lead);
            let inject_from_us = unix_us();
            let mut inject = Command::new(&exe_s);
            inject
                .args(["inject", s.name, "--json", "--intensity"])
                .arg(format!("{intensity:.3}"))
                .arg("--duration")
                .arg(format!("{}ms", span.as_millis()))
                .args(["--pid", &engine_pid.to_string()])
                .args(["--port", &api_port.to_string()])
                .args(["--cpus", &cpus])
                .arg("--engine-step")
                .arg(format!("{}us", step.as_micros()))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            let child = inject.spawn()?;
            let dive = args
                .deep_dives
                .then(|| {
                    std::thread::sleep(deep_dive_offset(span));
                    request_deep_dive(port, engine_pid)
                })
                .flatten();
            // A trial whose injector fails or hangs (e.g. blocked in the kernel on the
            // engine's memory map) is left out and said so; the evaluation goes on.
            let out = match wait_bounded(child, span + INJECT_GRACE) {
                Ok(out) if out.status.success() => out,
                Ok(out) => {
                    warn!(
                        "{} trial {trial} left out: the injector failed: {}",
                        s.name,
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    failed.push(format!("{} {trial}", s.name));
                    continue;
                }
                Err(e) => {
                    warn!("{} trial {trial} left out: {e:#}", s.name);
                    failed.push(format!("{} {trial}", s.name));
                    continue;
                }
            };
            let report: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
            // The injector's own start and end: the process start and exit are not injection.
            let inject_from_us = report["started_unix_us"].as_f64().unwrap_or(inject_from_us);
            let inject_to_us = report["ended_unix_us"].as_f64().unwrap_or_else(unix_us);
            std::thread::sleep(Duration::from_secs(4));
            let root_cause = dive.map(|id| deep_dive_category(port, id));
            let to_us = unix_us();
            info!(
                "{} trial {trial}: intensity {intensity:.2}, {:.1} s; {}",
                s.name,
                (inject_to_us - inject_from_us) / 1e6,
                report["mechanism"].as_str().unwrap_or("?")
            );
            records.push(TrialRecord {
                scenario: s.name.to_string(),
                trial,
                intensity,
                from_us,
                inject_from_us,
                inject_to_us,
                to_us,
                setup_ms: report["setup_ms"].as_f64(),
                mechanism: report["mechanism"].as_str().unwrap_or_default().to_string(),
                deep_dive: dive,
                root_cause: root_cause.flatten(),
                slowdown: None,
            });
        }
    }
    let _ = daemon.stop(Duration::from_secs(30));
    if !failed.is_empty() {
        warn!(
            "{} of {} trials left out (their injector failed): {}",
            failed.len(),
            scenarios.len() * args.trials,
            failed.join(", ")
        );
    }
    if failed.len() * 4 > scenarios.len() * args.trials {
        bail!(
            "{} of {} trials failed to inject: see the warnings above",
            failed.len(),
            scenarios.len() * args.trials
        );
    }
    if load.failed() > 0 {
        warn!(
            "{} load requests failed during the evaluation",
            load.failed()
        );
    }
    drop(load);
    if let Some(path) = engine_log {
        let log = slowdown::EngineLog::read(path, (unix_us() / 1e6) as i64)?;
        if log.is_empty() {
            warn!(
                "{} has no stamped iteration lines (is vLLM logging them, --enable-logging-iteration-details?): slowdowns not measured",
                path.display()
            );
        }
        for r in &mut records {
            r.slowdown = log.slowdown(r.from_us, r.inject_from_us, r.inject_to_us);
        }
    }
    let stream = report::read_iterations(&state.join("iterations.csv"))?;
    let detector = crate::config::Config::parse(&config, "evaluation")?
        .sentinel
        .params()
        .detector;
    let run = report::Run {
        ucl,
        step,
        detector,
    };
    write_outputs(&args.out, scenarios, &records, &stream, &run, args)
}

/// A free loopback port for the daemon's API.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Starts `stallscope run` with `config` (written to `state`), its log in `state`.
fn start_daemon(state: &Path, config: &str) -> Result<Group> {
    let config_path = state.join("evaluate.toml");
    std::fs::write(&config_path, config)?;
    let exe = std::env::current_exe()?;
    Group::spawn(
        Command::new(&exe)
            .args(["run", "--config"])
            .arg(&config_path)
            .stderr(std::fs::File::create(state.join("daemon.log"))?),
    )
    .with_context(|| format!("cannot start {}", exe.display()))
}

/// Waits for the daemon on `port` to have fitted engine `pid`'s baseline; the engine's status.
fn wait_fitted(port: u16, pid: u64, timeout: Duration, state: &Path) -> Result<Value> {
    let t = Instant::now();
    loop {
        if let Some(e) = engine_status(port, pid).filter(|e| e["model_state"] == "fitted") {
            return Ok(e);
        }
        if t.elapsed() > timeout {
            bail!(
                "no fitted baseline within {timeout:?}: see {}",
                state.join("daemon.log").display()
            );
        }
        std::thread::sleep(Duration::from_secs(2));
    }
}

/// Longest an injector may run past its planned span before the trial is given up.
const INJECT_GRACE: Duration = Duration::from_secs(30);

/// Waits for `child`; past `limit` it is stopped (SIGTERM: the injector undoes itself) and the
/// trial fails.
fn wait_bounded(mut child: Child, limit: Duration) -> Result<std::process::Output> {
    let t = Instant::now();
    while child.try_wait()?.is_none() {
        if t.elapsed() > limit {
            // SAFETY: kill(2) on our own child.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            bail!("the injector was still running after {limit:?}; it was stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(child.wait_with_output()?)
}

fn unix_us() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// `config` with the daemon's API on loopback `port`, its state under `state` and every
/// iteration exported.
fn with_state(config: &str, state: &Path, port: u16) -> String {
    config
        .replace(
            "listen = \"127.0.0.1:9464\"",
            &format!("listen = \"127.0.0.1:{port}\""),
        )
        .replace(
            "dir = \"/var/lib/stallscope\"",
            &format!("dir = \"{}\"", state.display()),
        )
        .replace(
            "iterations_csv = \"\"",
            &format!("iterations_csv = \"{}/iterations.csv\"", state.display()),
        )
}

/// The daemon's configuration for an evaluation: the embedded default with its state under
/// `state`, every iteration exported, one model (no refit, so one UCL), and deep dives only
/// on request.
fn evaluation_config(state: &Path, port: u16, deep_dives: bool) -> String {
    let mut cfg = with_state(DEFAULT_CONFIG, state, port)
        .replace("refit_every = 5000", "refit_every = 0")
        .replace("on_alert = true", "on_alert = false")
        .replace("max_per_hour = 6", "max_per_hour = 1000")
        // The trials follow each other within seconds: the reference is taken right after the
        // fit, as soon as the engine has been healthy for 2 s.
        .replace("reference_settle = \"30s\"", "reference_settle = \"2s\"");
    if !deep_dives {
        cfg = cfg.replace("reference_every = \"10m\"", "reference_every = \"1000h\"");
    }
    cfg
}

/// Longest wait for the first normal reference after the fit.
const REFERENCE_WAIT: Duration = Duration::from_secs(120);

/// How long after the injector's start a trial's deep dive is asked for: so that its window
/// covers the injection's last [`DEEP_DIVE_WINDOW`] seconds and ends [`DEEP_DIVE_MARGIN`]
/// before the injection does, but never sooner than the margin after the start (the
/// injector needs a moment to start its stress). An injection's effect may build up over it
/// (io-contention's page-outs and disk queue: a window right after the start can find the
/// engine's steps no slower than the normal reference's although the injection as a whole
/// slowed it); an alert's deep dive, too, comes after the detection's lag.
fn deep_dive_offset(span: Duration) -> Duration {
    span.saturating_sub(Duration::from_secs_f64(DEEP_DIVE_WINDOW) + DEEP_DIVE_MARGIN)
        .max(DEEP_DIVE_MARGIN)
}

/// See [`deep_dive_offset`].
const DEEP_DIVE_MARGIN: Duration = Duration::from_millis(300);

/// POSTs a deep dive of the injection; its id.
fn request_deep_dive(port: u16, pid: u64) -> Option<u64> {
    let body = json!({ "pid": pid, "duration_s": DEEP_DIVE_WINDOW }).to_string();
    match api(port, "POST", "/api/v1/deep-dive", &body) {
        Ok((202, v)) => v["id"].as_u64(),
        Ok((code, v)) => {
            warn!("deep dive refused ({code}): {v}");
            None
        }
        Err(e) => {
            warn!("deep dive request failed: {e:#}");
            None
        }
    }
}

/// Waits (at most 2 minutes) for deep dive `id`; its category, or `none` when nothing stood
/// out.
fn deep_dive_category(port: u16, id: u64) -> Option<String> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(120) {
        if let Ok((200, r)) = api(port, "GET", &format!("/api/v1/deep-dives/{id}"), "") {
            match r["state"].as_str() {
                Some("done") => return Some(r["category"].as_str().unwrap_or("none").to_string()),
                Some("failed") => return None,
                _ => {}
            }
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn injection_spans_are_ranges_of_decode_steps() {
        assert_eq!(steps("80..160"), Ok((80.0, 160.0)));
        assert_eq!(steps("1..1"), Ok((1.0, 1.0)));
        for bad in ["80", "160..80", "0..5", "a..5", "5..inf"] {
            assert!(steps(bad).is_err(), "{bad}");
        }
        assert_eq!(intensities("0.1..1.0"), Ok((0.1, 1.0)));
        for bad in ["0..1", "0.5..1.5", "0.8..0.5", "x..1", "0.5"] {
            assert!(intensities(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_trials_deep_dive_covers_the_injections_last_seconds() {
        let ms = |v: u64| Duration::from_millis(v);
        for (span, offset) in [
            (ms(4_000), ms(1_700)),
            (ms(24_000), ms(21_700)),
            // Too short for the window to end the margin before it: from the margin on.
            (ms(2_400), ms(300)),
            (ms(1_000), ms(300)),
        ] {
            assert_eq!(deep_dive_offset(span), offset, "{span:?}");
        }
    }

    #[test]
    fn the_evaluation_config_changes_every_setting_it_means_to() {
        // Each replacement matches the embedded default's text (a reworded default would
        // silently leave the daemon's setting in place).
        let cfg = evaluation_config(Path::new("/tmp/eval-state"), 4321, true);
        for line in [
            "listen = \"127.0.0.1:4321\"",
            "dir = \"/tmp/eval-state\"",
            "iterations_csv = \"/tmp/eval-state/iterations.csv\"",
            "refit_every = 0",
            "on_alert = false",
            "max_per_hour = 1000",
            "reference_settle = \"2s\"",
            "reference_every = \"10m\"",
        ] {
            assert!(cfg.contains(line), "{line} missing");
        }
        let cfg = evaluation_config(Path::new("/tmp/eval-state"), 4321, false);
        assert!(cfg.contains("reference_every = \"1000h\""));
        crate::config::Config::parse(&cfg, "evaluation").expect("the evaluation config parses");
    }
}
