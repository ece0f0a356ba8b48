//! `cargo xtask bench --only overhead`: what the daemon costs vLLM, by vLLM's own clock.
//!
//! Separate load runs differ by more than the cost sought (the "off" runs of
//! `--only sentinel` spread ±10 % on a 2-vCPU host), so this compares adjacent windows of
//! one long steady load instead: the daemon is started and stopped in turn, and each round's
//! ratio sets a window against the "off" window beside it, so drift slower than a round
//! cancels. Transitions (attach, detach) fall between windows. Two measures per window,
//! from vLLM's iteration log:
//! - the median and 99th percentile of the decode-only steps at batch 8 (equal work per step,
//!   one output token per request): vLLM's elapsed time spans the forward pass and sampling;
//! - the decode period: the window's whole seconds less vLLM's prefill and mixed steps, per
//!   decode-only step; it spans the whole loop, the scheduler and the Python probe included.
//!
//! A round's ratio moves with the host (another tenant taking the vCPUs: `steal` in
//! `/proc/stat`, reported per window), in episodes that can slow one window by 10 %: the
//! median round and its distribution-free interval are reported beside the mean.
//! `STALLSCOPE_OVERHEAD_ROUNDS` sets the rounds (default 60) and `STALLSCOPE_OVERHEAD_ARMS`
//! the arms beside "off" (`daemon`, `kernel`; default both).

use std::{
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::bench_sentinel::{
    cpu_and_rss, fresh_dir, mean_ci95, server_log, start_daemon, warm_up, xtask_bin, Arm,
};

/// Rounds unless `STALLSCOPE_OVERHEAD_ROUNDS` says otherwise; each has one window per arm.
const ROUNDS: usize = 60;
/// Length of a window.
const WINDOW: Duration = Duration::from_secs(20);
/// Wait after the daemon attached or exited before a window opens.
const SETTLE: Duration = Duration::from_secs(3);

/// One window's figures.
#[derive(Clone, Copy)]
struct Window {
    /// Median of the decode-only steps at batch 8, ms: the time per output token.
    step_ms: f64,
    /// Their 99th percentile, ms.
    step_p99_ms: f64,
    /// How many such steps the window held.
    steps: usize,
    /// The decode period over the window's whole seconds, ms (None without a decode step).
    period_ms: Option<f64>,
    /// The hypervisor's share of the host's CPUs over the window (`steal`), %.
    steal_pct: Option<f64>,
    /// The daemon's CPU over the window, % of one core (None for "off").
    daemon_cpu_pct: Option<f64>,
    /// The daemon's RSS at the window's end, MiB.
    daemon_rss_mib: Option<f64>,
}

/// One of a window's measures of the engine's pace.
type Measure = fn(&Window) -> Option<f64>;

/// The arms beside "off", from `STALLSCOPE_OVERHEAD_ARMS`.
fn arms() -> Result<Vec<Arm>> {
    let spec = std::env::var("STALLSCOPE_OVERHEAD_ARMS").unwrap_or("daemon,kernel".into());
    let mut arms = vec![Arm::Off];
    for name in spec.split(',').map(str::trim) {
        arms.push(match name {
            "daemon" => Arm::Full,
            "kernel" => Arm::KernelOnly,
            _ => bail!(
                "STALLSCOPE_OVERHEAD_ARMS: unknown arm {name:?}; give `daemon`, `kernel` or both, comma-separated"
            ),
        });
    }
    Ok(arms)
}

fn rounds() -> Result<usize> {
    crate::env_count("STALLSCOPE_OVERHEAD_ROUNDS", ROUNDS, "rounds")
}

pub fn run() -> Result<()> {
    let Some(log) = server_log()? else {
        println!("\n(overhead skipped: no vLLM server; run `cargo xtask vllm up` first)");
        return Ok(());
    };
    let (arms, rounds) = (arms()?, rounds()?);
    let dir = fresh_dir("stallscope-bench-overhead")?;
    warm_up(&dir)?;

    let per_window = WINDOW + SETTLE * 2 + Duration::from_secs(15);
    let total = per_window * (rounds * arms.len()) as u32 + Duration::from_secs(30);
    let mut load = Command::new(xtask_bin())
        .args(["vllm", "load", "--concurrency", "8"])
        .args(["--prompt-tokens", "64", "--output-tokens", "128"])
        .args(["--seed", "4242", "--duration"])
        .arg(total.as_secs().to_string())
        .stdout(Stdio::null())
        .spawn()?;
    sleep(Duration::from_secs(10));
    let mut windows: Vec<Vec<Window>> = vec![Vec::new(); arms.len()];
    let result = (|| -> Result<()> {
        for round in 0..rounds {
            // Rotating order: with one arm beside "off", off-on then on-off (ABBA).
            for k in 0..arms.len() {
                let a = (round + k) % arms.len();
                windows[a].push(window(&dir, &log, arms[a])?);
            }
            if load.try_wait()?.is_some() {
                bail!("the steady load ended early");
            }
            eprintln!("overhead: round {} of {rounds} done", round + 1);
        }
        Ok(())
    })();
    let _ = load.kill();
    let _ = load.wait();
    result?;
    report(&arms, &windows);
    Ok(())
}

/// The hypervisor's ticks taken from all CPUs (`steal` of `/proc/stat`'s `cpu` line).
fn steal_ticks() -> Option<u64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    stat.lines().next()?.split_whitespace().nth(8)?.parse().ok()
}

fn unix_s() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// The decode period over the whole seconds in `[from_s, to_s)` ([`vllm_log::Seconds`]).
fn decode_period(steps: &[vllm_log::Iteration], from_s: f64, to_s: f64) -> Option<f64> {
    let (first, end) = (from_s.ceil() as i64, to_s.floor() as i64);
    let year = vllm_log::year_of(first);
    let mut w = vllm_log::Seconds::new(first, end)?;
    for it in steps {
        if it
            .stamp
            .is_some_and(|s| (first..end).contains(&s.unix_s(year)))
        {
            w.add(it.elapsed_ms, it.is_decode());
        }
    }
    w.decode_period()
}

/// Runs one window of `arm` under the steady load.
fn window(dir: &Path, log: &Path, arm: Arm) -> Result<Window> {
    let daemon = match arm {
        Arm::Off => None,
        _ => Some(start_daemon(dir, arm)?),
    };
    sleep(SETTLE);
    let from = std::fs::metadata(log)?.len() as usize;
    let pid = daemon.as_ref().map(|d| d.0.id());
    let c0 = pid.and_then(cpu_and_rss).map(|c| c.0);
    let (s0, open_s, t) = (steal_ticks(), unix_s(), Instant::now());
    sleep(WINDOW);
    let (s1, close_s, wall) = (steal_ticks(), unix_s(), t.elapsed().as_secs_f64());
    let end = pid.and_then(cpu_and_rss);
    // The log's lines of the window's last second come a moment after it.
    sleep(Duration::from_millis(1500));
    let text = std::fs::read(log)?;
    let tail = String::from_utf8_lossy(&text[from.min(text.len())..]);
    let logged = vllm_log::parse(&tail);
    let (b8, _) = crate::vllm_size::decode_elapsed(&logged, Some(8));
    if b8.is_empty() {
        bail!("no decode step at batch 8 in vLLM's log over a window");
    }
    let at = |q: f64| b8[((b8.len() - 1) as f64 * q).round() as usize];
    drop(daemon);
    sleep(SETTLE);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    // Clock ticks of 10 ms (USER_HZ 100).
    Ok(Window {
        step_ms: b8[b8.len() / 2],
        step_p99_ms: at(0.99),
        steps: b8.len(),
        period_ms: decode_period(&logged, open_s, close_s),
        steal_pct: s0
            .zip(s1)
            .map(|(a, b)| b.saturating_sub(a) as f64 / (wall * cpus)),
        daemon_cpu_pct: c0
            .zip(end)
            .map(|(c0, (c1, _))| c1.saturating_sub(c0) as f64 / wall),
        daemon_rss_mib: end.map(|(_, rss)| rss as f64 / 1024.0),
    })
}

/// The median of `v` and its distribution-free 95 % interval: the order statistics k and
/// n + 1 − k, k the largest with P(Binomial(n, ½) < k) ≤ 2.5 % (None below 6 values, where
/// no such k exists).
fn median_ci95(v: &[f64]) -> (f64, Option<(f64, f64)>) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    let median = s[n / 2] / 2.0 + s[(n - 1) / 2] / 2.0;
    // P(X < k) for X ~ Binomial(n, ½), k = 1, 2, ...
    let (mut below, mut pmf, mut k) = (0.0, 0.5f64.powi(n as i32), 0);
    while k < n / 2 && below + pmf <= 0.025 {
        below += pmf;
        pmf *= (n - k) as f64 / (k + 1) as f64;
        k += 1;
    }
    (median, (k > 0).then(|| (s[k - 1], s[n - k])))
}

fn report(arms: &[Arm], windows: &[Vec<Window>]) {
    println!("\n## Overhead on vLLM (cargo xtask bench --only overhead)\n");
    println!(
        "One steady load (8 requests at a time, 64 prompt and 128 output tokens); {} rounds of one {} s window per arm in rotating order.\n",
        windows[0].len(),
        WINDOW.as_secs()
    );
    println!("| round | arm | vLLM decode step at batch 8, median / p99 (ms) | steps | decode period (ms) | steal (% of the CPUs) | daemon CPU (% of a core) | daemon RSS (MiB) |\n|---|---|---|---|---|---|---|---|");
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    for round in 0..windows[0].len() {
        for (arm, w) in arms.iter().zip(windows) {
            let w = &w[round];
            println!(
                "| {} | {} | {:.2} / {:.2} | {} | {} | {} | {} | {} |",
                round + 1,
                arm.name(),
                w.step_ms,
                w.step_p99_ms,
                w.steps,
                opt(w.period_ms, 2),
                opt(w.steal_pct, 2),
                opt(w.daemon_cpu_pct, 2),
                opt(w.daemon_rss_mib, 1)
            );
        }
    }
    println!();
    let pct = |x: f64| format!("{:+.2} %", 100.0 * x);
    for (a, arm) in arms.iter().enumerate().skip(1) {
        let measures: [(&str, Measure); 3] = [
            ("decode step at batch 8", |w| Some(w.step_ms)),
            ("decode step at batch 8, p99", |w| Some(w.step_p99_ms)),
            ("decode period", |w| w.period_ms),
        ];
        for (what, of) in measures {
            let ratios: Vec<f64> = windows[a]
                .iter()
                .zip(&windows[0])
                .filter_map(|(x, off)| Some(of(x)? / of(off)? - 1.0))
                .collect();
            if ratios.len() < 2 {
                continue;
            }
            let (mean, half) = mean_ci95(&ratios);
            let (median, interval) = median_ci95(&ratios);
            println!(
                "{} vs off, vLLM's {what}: mean {} (95 % CI {} to {}), median round {} ({}), {} rounds",
                arm.name(),
                pct(mean),
                pct(mean - half),
                pct(mean + half),
                pct(median),
                interval.map_or("too few rounds for its interval".into(), |(lo, hi)| {
                    format!("95 % CI {} to {}", pct(lo), pct(hi))
                }),
                ratios.len(),
            );
        }
        let cpu: Vec<f64> = windows[a].iter().filter_map(|w| w.daemon_cpu_pct).collect();
        let rss = windows[a]
            .iter()
            .filter_map(|w| w.daemon_rss_mib)
            .fold(0.0, f64::max);
        println!(
            "{}: CPU {:.2} % of a core (mean over its windows), RSS max {rss:.1} MiB",
            arm.name(),
            cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_medians_interval_is_the_binomial_order_statistics() {
        // (n, k): for n = 6 the interval is the extremes (P(X = 0) = 1.6 %); for n = 60 it is
        // the 22nd and 39th values (P(X < 22) = 1.4 %, P(X < 23) = 2.6 %).
        let cases = [(5, None), (6, Some(1)), (10, Some(2)), (60, Some(22))];
        for (n, k) in cases {
            let v: Vec<f64> = (1..=n).rev().map(f64::from).collect();
            let (median, interval) = median_ci95(&v);
            assert_eq!(median, (f64::from(n) + 1.0) / 2.0, "n = {n}");
            assert_eq!(
                interval,
                k.map(|k| (f64::from(k), f64::from(n + 1 - k))),
                "n = {n}"
            );
        }
    }

    #[test]
    fn the_decode_period_leaves_out_prefills_and_partial_seconds() {
        let line = |sec: u8, context: u64, ms: f64| {
            format!("(APIServer pid=7) INFO 11-30 10:00:{sec:02} [loggers.py:199] Engine 000: Iteration(1): {context} context requests, {} context tokens, 8 generation requests, 8 generation tokens, iteration elapsed time: {ms} ms\n", context * 64)
        };
        // Second 1: 40 decode steps and a 200 ms prefill; second 2: 50 decode steps; seconds 0
        // and 3 only partly in the window.
        let mut log = line(0, 0, 20.0);
        log += &line(1, 1, 200.0);
        (0..40).for_each(|_| log += &line(1, 0, 20.0));
        (0..50).for_each(|_| log += &line(2, 0, 20.0));
        log += &line(3, 0, 20.0);
        let at = |sec: f64| {
            vllm_log::Stamp {
                month: 11,
                day: 30,
                hour: 10,
                minute: 0,
                second: 0,
            }
            .unix_s(2026) as f64
                + sec
        };
        let period = decode_period(&vllm_log::parse(&log), at(0.5), at(3.5)).unwrap();
        assert!((period - 1800.0 / 90.0).abs() < 1e-9, "{period}");
    }
}
