//! `cargo xtask bench --only sentinel`: the baseline's fit time and per-iteration prediction
//! cost, and, against the real vLLM server (`cargo xtask vllm up` first), the sentinel's
//! throughput overhead (A/B interleaved), the daemon's CPU and RSS, and the verdict latency
//! (iteration end to alert decision).

use std::{
    hint::black_box,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use model::{synthetic::decode_samples, Baseline, BaselineParams, Fingerprint, Workload};

/// Rounds of load runs, one per arm each (off, the daemon, its kernel plane only).
const ROUNDS: usize = 10;
/// Requests per load run: 3 waves of 8 in lockstep, each a prefill and 127 decode steps at
/// batch 8, so that every run does the same work (fixed lengths, `ignore_eos`).
const REQUESTS: &str = "24";
const PROMPT_TOKENS: &str = "64";
const OUTPUT_TOKENS: &str = "128";

pub fn run() -> Result<()> {
    model_costs()?;
    crate::bench_folds::run()?;
    vllm_overhead()
}

fn model_costs() -> Result<()> {
    let data = decode_samples(20_000, 1);
    let fp = Fingerprint {
        framework: "bench".into(),
        model: "synthetic".into(),
        hardware: "-".into(),
    };
    let t = Instant::now();
    let b = Baseline::fit(&data, &BaselineParams::default(), fp)?;
    let fit = t.elapsed();
    let queries: Vec<Workload> = decode_samples(4096, 2)
        .into_iter()
        .map(|s| s.workload)
        .collect();
    let rounds = 100;
    let t = Instant::now();
    let mut sum = 0.0;
    for _ in 0..rounds {
        for q in &queries {
            sum += b.predict(black_box(q));
        }
    }
    black_box(sum);
    let per = t.elapsed().as_nanos() as f64 / (rounds * queries.len()) as f64;
    println!("\n## Sentinel model (cargo xtask bench --only sentinel)\n");
    println!("| what | value |\n|---|---|");
    println!(
        "| fit at 20,000 samples (5 out-of-fold fits + the final one, 200 trees of depth 5) | {:.2} s |",
        fit.as_secs_f64()
    );
    println!("| predict, per iteration | {per:.0} ns |");
    println!(
        "| model size | {} trees, {} nodes, {} KiB JSON |",
        b.gbdt.roots.len(),
        b.gbdt.nodes.len(),
        b.to_json().len() / 1024
    );
    recalibration_cost();
    Ok(())
}

/// The recalibration's cost on a 1 ms engine with the default window ("10s"): ~10,000 ratios
/// held, their median retaken once a second on the verdict path. Per iteration, and the
/// longest single iteration (the one that retakes the median), over 60 s of iterations.
fn recalibration_cost() {
    use model::{detector::Span, recalibration::Recalibration};
    let steps = 60_000u64;
    // Ratios spread around 1.05, as a model running a little low leaves them.
    let observed = |i: u64| 1_000.0 * (1.0 + 0.1 * ((i * 7919 % 1000) as f64 / 1000.0));
    let mut r = Recalibration::new(Span::Micros(10_000_000), 0.2);
    let t = Instant::now();
    for i in 0..steps {
        r.push(black_box(i * 1_000_000), observed(i), 1_000.0);
    }
    let per = t.elapsed().as_nanos() as f64 / steps as f64;
    black_box(r.factor());
    // Again, each iteration timed alone (the clock reads kept out of the figure above).
    let mut r = Recalibration::new(Span::Micros(10_000_000), 0.2);
    let (mut longest, mut longest_at) = (Duration::ZERO, 0);
    for i in 0..steps {
        let one = Instant::now();
        r.push(black_box(i * 1_000_000), observed(i), 1_000.0);
        let took = one.elapsed();
        if took > longest {
            (longest, longest_at) = (took, i);
        }
    }
    black_box(r.factor());
    println!(
        "| recalibration over 10 s on a 1 ms engine (~10,000 ratios), per iteration / the longest one (iteration {longest_at}: a median retaken) | {per:.0} ns / {:.0} µs |",
        longest.as_secs_f64() * 1e6
    );
}

pub(crate) fn xtask_bin() -> PathBuf {
    crate::root().join("target/release/xtask")
}

/// One load run's figures: the client's, and vLLM's own decode step at batch 8 from its
/// log over the run.
#[derive(Clone)]
struct RunFigures {
    tokens_per_s: f64,
    latency_p50_s: f64,
    latency_p99_s: f64,
    step_b8_ms: f64,
}

/// One bounded load run of fixed-length requests, prompts drawn by `seed`.
fn load_run(seed: usize, server_log: &std::path::Path) -> Result<RunFigures> {
    let from = std::fs::metadata(server_log).map_or(0, |m| m.len() as usize);
    let out = Command::new(xtask_bin())
        .args(["vllm", "load", "--requests", REQUESTS, "--concurrency", "8"])
        .args([
            "--prompt-tokens",
            PROMPT_TOKENS,
            "--output-tokens",
            OUTPUT_TOKENS,
        ])
        .arg("--seed")
        .arg(seed.to_string())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("load run failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.lines().last().context("no summary")?)?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("no {k} in the load summary {v}"))
    };
    let log = std::fs::read(server_log)?;
    let tail = String::from_utf8_lossy(&log[from.min(log.len())..]);
    let (step_b8_ms, _) = crate::vllm_size::decode_step_b8(&tail)
        .context("no decode step at batch 8 in vLLM's log over the run")?;
    Ok(RunFigures {
        tokens_per_s: num("output_tokens_per_s")?,
        latency_p50_s: num("latency_p50_s")?,
        latency_p99_s: num("latency_p99_s")?,
        step_b8_ms,
    })
}

/// utime + stime of a process, in clock ticks, and its RSS in KiB.
pub(crate) fn cpu_and_rss(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    Some((ticks, status_number(&status, "VmRSS")?))
}

/// The number of a `/proc/PID/status` line (kB for sizes).
pub(crate) fn status_number(status: &str, key: &str) -> Option<u64> {
    pyframe_tracer::procfs::status_field(status, key)?
        .trim_end_matches(" kB")
        .parse()
        .ok()
}

pub(crate) struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

/// What runs beside the engine in one arm of the comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Arm {
    /// Nothing.
    Off,
    /// The daemon as shipped: kernel plane, Python probes, sentinel.
    Full,
    /// The daemon with no engine to attach its Python probes to: the kernel plane alone
    /// (it still watches vLLM's processes by `[watch] process_patterns`).
    KernelOnly,
}

impl Arm {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Arm::Off => "off",
            Arm::Full => "daemon",
            Arm::KernelOnly => "kernel plane only",
        }
    }
}

/// Starts the daemon for `arm` with its state in `dir` and waits until it follows the engine:
/// its Python probes attached (the engine's main thread takes them at its next step, so a
/// short load brings them in) or, kernel plane only, its processes watched.
pub(crate) fn start_daemon(dir: &std::path::Path, arm: Arm) -> Result<Daemon> {
    let config = match arm {
        Arm::KernelOnly => "[sentinel]\nengine_patterns = [\"stallscope-bench: no such engine\"]\n",
        Arm::Off | Arm::Full => "",
    };
    start_daemon_with(dir, arm, config)
}

/// [`start_daemon`] with `config` (TOML) laid over the daemon's default.
pub(crate) fn start_daemon_with(dir: &std::path::Path, arm: Arm, config: &str) -> Result<Daemon> {
    let name = arm.name().replace(' ', "-");
    let log_path = dir.join(format!("daemon-{name}.log"));
    let log = std::fs::File::create(&log_path)?;
    let mut cmd = Command::new(crate::stallscope_bin());
    cmd.args(["run", "--listen", "127.0.0.1:9477", "--state-dir"])
        .arg(dir.join(&name));
    if !config.is_empty() {
        let cfg = dir.join(format!("{name}.toml"));
        std::fs::write(&cfg, config)?;
        cmd.arg("--config").arg(cfg);
    }
    let d = Daemon(cmd.stderr(log).spawn()?);
    let want = if arm == Arm::Full {
        ": attached ("
    } else {
        "kernel plane: watching pid"
    };
    let until = Instant::now() + Duration::from_secs(60);
    while !std::fs::read_to_string(&log_path)?.contains(want) {
        if Instant::now() > until {
            bail!(
                "the daemon did not follow the engine in 60 s: see {}",
                log_path.display()
            );
        }
        if arm == Arm::Full {
            nudge()?;
        } else {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    Ok(d)
}

/// `xtask vllm load` of short requests (16 prompt tokens) two at a time, quietly; `how` says
/// how many or for how long, and how many output tokens.
fn small_load(how: &[&str]) -> Command {
    let mut cmd = Command::new(xtask_bin());
    cmd.args([
        "vllm",
        "load",
        "--concurrency",
        "2",
        "--prompt-tokens",
        "16",
    ])
    .args(how)
    .stdout(Stdio::null())
    .stderr(Stdio::null());
    cmd
}

/// Two short requests: the engine's main thread steps, so a pending attach or detach lands.
fn nudge() -> Result<()> {
    if !small_load(&["--requests", "2", "--output-tokens", "8"])
        .status()?
        .success()
    {
        bail!("a nudge request failed");
    }
    Ok(())
}

/// Stops the daemon while the engine steps, so that its probes' detach lands at once (an idle
/// engine's main thread waits in a socket, and they would stay until their lease ran out).
fn stop_daemon(d: Daemon) -> Result<()> {
    let mut load = small_load(&["--duration", "4", "--output-tokens", "32"]).spawn()?;
    std::thread::sleep(Duration::from_millis(500));
    drop(d);
    load.wait()?;
    Ok(())
}

pub(crate) fn metrics() -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect("127.0.0.1:9477").ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut r = String::new();
    s.read_to_string(&mut r).ok()?;
    Some(r)
}

/// A Prometheus histogram's cumulative buckets (upper bound, count).
fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let mut buckets: Vec<(f64, f64)> = text
        .lines()
        .filter(|l| l.starts_with(&format!("{name}_bucket")))
        .filter_map(|l| {
            let le = l.split("le=\"").nth(1)?.split('"').next()?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, l.rsplit(' ').next()?.parse().ok()?))
        })
        .collect();
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    buckets
}

/// Adds `more` to the cumulative buckets in `sum` (the same bounds; `sum` empty at first).
fn add_buckets(sum: &mut Vec<(f64, f64)>, more: &[(f64, f64)]) {
    if sum.is_empty() {
        sum.extend_from_slice(more);
    } else {
        for (s, m) in sum.iter_mut().zip(more) {
            s.1 += m.1;
        }
    }
}

/// The q-quantile of cumulative histogram buckets (linear inside the bucket).
fn quantile(buckets: &[(f64, f64)], q: f64) -> Option<f64> {
    let total = buckets.last()?.1;
    let want = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in buckets {
        if c >= want {
            if le.is_infinite() {
                return Some(prev.0);
            }
            return Some(prev.0 + (le - prev.0) * (want - prev.1) / (c - prev.1).max(1e-9));
        }
        prev = (le, c);
    }
    None
}

/// Mean and half-width of its 95 % confidence interval (Student's t) of `v`.
pub(crate) fn mean_ci95(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0).max(1.0);
    // t(0.975) for n - 1 degrees of freedom, n = 2..=30; beyond, the normal's 1.96.
    const T: [f64; 29] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
        2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
        2.052, 2.048, 2.045,
    ];
    let t = T.get(v.len().saturating_sub(2)).copied().unwrap_or(1.96);
    (mean, t * (var / n).sqrt())
}

/// What `cargo xtask vllm up` recorded of the server it started; None when there is none.
pub(crate) fn server_state() -> Result<Option<serde_json::Value>> {
    let state = crate::setup::cache_dir().join("vllm-run/server.json");
    if !state.exists() {
        return Ok(None);
    }
    Ok(Some(serde_json::from_slice(&std::fs::read(&state)?)?))
}

/// The log of the server `cargo xtask vllm up` started; None when there is none.
pub(crate) fn server_log() -> Result<Option<PathBuf>> {
    let Some(server) = server_state()? else {
        return Ok(None);
    };
    let log = server["log"]
        .as_str()
        .context("no log in the server's state")?;
    Ok(Some(PathBuf::from(log)))
}

/// An empty folder `name` in the temporary directory, for one bench's daemons.
pub(crate) fn fresh_dir(name: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Warms the engine up with the daemon attached (state in `dir`) long enough to fit its model
/// (1,000 decode iterations), which the daemon stores and every later start loads: later
/// runs' iterations then get verdicts from the first.
pub(crate) fn warm_up(dir: &std::path::Path) -> Result<()> {
    let d = start_daemon(dir, Arm::Full)?;
    let warm = Command::new(xtask_bin())
        .args([
            "vllm",
            "load",
            "--duration",
            "60",
            "--concurrency",
            "8",
            "--seed",
            "99",
        ])
        .stdout(Stdio::null())
        .status()?;
    if !warm.success() {
        bail!("the warm-up load failed");
    }
    stop_daemon(d)
}

fn vllm_overhead() -> Result<()> {
    let Some(server_log) = server_log()? else {
        println!("\n(vLLM part skipped: no server; run `cargo xtask vllm up` first)");
        return Ok(());
    };
    let dir = fresh_dir("stallscope-bench-sentinel")?;
    warm_up(&dir)?;
    let arms = [Arm::Off, Arm::Full, Arm::KernelOnly];
    let mut runs: Vec<Vec<RunFigures>> = vec![Vec::new(); arms.len()];
    // Per daemon arm: CPU seconds, wall seconds, the largest RSS (KiB).
    let mut cost = [(0.0, 0.0, 0u64); 3];
    let mut verdicts = Vec::new();
    let hz = 100.0;
    for round in 0..ROUNDS {
        // Each round runs every arm once, the order rotating; every run gets prompts of its
        // own (vLLM's prefix cache would favour a repeated set).
        for k in 0..arms.len() {
            let a = (round + k) % arms.len();
            let arm = arms[a];
            let seed = 1000 + arms.len() * round + a;
            let run = if arm == Arm::Off {
                load_run(seed, &server_log)?
            } else {
                let d = start_daemon(&dir, arm)?;
                let t = Instant::now();
                let c0 = cpu_and_rss(d.0.id()).map_or(0, |c| c.0);
                let run = load_run(seed, &server_log)?;
                let (c1, rss) = cpu_and_rss(d.0.id()).unwrap_or((c0, 0));
                cost[a].0 += c1.saturating_sub(c0) as f64 / hz;
                cost[a].1 += t.elapsed().as_secs_f64();
                cost[a].2 = cost[a].2.max(rss);
                if arm == Arm::Full {
                    add_buckets(
                        &mut verdicts,
                        &histogram_buckets(
                            &metrics().unwrap_or_default(),
                            "stallscope_verdict_latency_seconds",
                        ),
                    );
                }
                stop_daemon(d)?;
                run
            };
            runs[a].push(run);
        }
    }
    println!("\n## Sentinel on vLLM (cargo xtask bench --only sentinel)\n");
    println!(
        "{ROUNDS} rounds, each one run per arm in rotating order; a run is {REQUESTS} requests of {PROMPT_TOKENS} prompt and {OUTPUT_TOKENS} output tokens, 8 at a time.\n"
    );
    println!("| round | arm | output tok/s | vLLM step at batch 8 (ms) | request latency p50 / p99 (s) |\n|---|---|---|---|---|");
    for round in 0..ROUNDS {
        for (arm, arm_runs) in arms.iter().zip(&runs) {
            let r = &arm_runs[round];
            println!(
                "| {} | {} | {:.1} | {:.2} | {:.3} / {:.3} |",
                round + 1,
                arm.name(),
                r.tokens_per_s,
                r.step_b8_ms,
                r.latency_p50_s,
                r.latency_p99_s
            );
        }
    }
    println!();
    for (a, arm) in arms.iter().enumerate().skip(1) {
        let ratio = |f: fn(&RunFigures) -> f64| -> Vec<f64> {
            runs[a]
                .iter()
                .zip(&runs[0])
                .map(|(x, o)| f(x) / f(o))
                .collect()
        };
        for (what, r) in [
            ("output tokens/s", ratio(|r| r.tokens_per_s)),
            ("vLLM's decode step at batch 8", ratio(|r| r.step_b8_ms)),
            ("request latency p50", ratio(|r| r.latency_p50_s)),
            ("request latency p99", ratio(|r| r.latency_p99_s)),
        ] {
            let (mean, half) = mean_ci95(&r);
            println!(
                "{} / off, {what}: mean {mean:.4}, 95 % CI {:.4} to {:.4}",
                arm.name(),
                mean - half,
                mean + half
            );
        }
        let (cpu, wall, rss) = cost[a];
        println!(
            "{}: daemon CPU {:.2} % of one core under load; RSS max {} MiB",
            arm.name(),
            100.0 * cpu / wall.max(1e-9),
            rss / 1024
        );
    }
    println!(
        "verdict latency (iteration end -> verdict) over the daemon's runs: p50 {:.0} us, p99 {:.0} us, {} verdicts",
        quantile(&verdicts, 0.5).unwrap_or(f64::NAN) * 1e6,
        quantile(&verdicts, 0.99).unwrap_or(f64::NAN) * 1e6,
        verdicts.last().map_or(0.0, |b| b.1)
    );
    Ok(())
}
