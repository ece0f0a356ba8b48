//! `cargo xtask bench --only overhead`: what the daemon costs vLLM, by vLLM's own clock.
//!
//! Separate load runs differ by more than the cost sought (the "off" runs of
//! `--only sentinel` spread ±10 % on a 2-vCPU host), so this compares adjacent windows of
//! one long steady load instead: the daemon is started and stopped in turn, each window
//! takes the median of vLLM's decode-only steps at batch 8 from its iteration log (equal
//! work per step), and each round's ratio sets a window against the "off" window beside it,
//! so drift slower than a round cancels. Transitions (attach, detach) fall between windows.

use std::{
    path::Path,
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::bench_sentinel::{
    cpu_and_rss, fresh_dir, mean_ci95, server_log, start_daemon, warm_up, xtask_bin, Arm,
};

/// Rounds; each has one window per arm, in rotating order.
const ROUNDS: usize = 10;
/// Length of a window.
const WINDOW: Duration = Duration::from_secs(20);
/// Wait after the daemon attached or exited before a window opens.
const SETTLE: Duration = Duration::from_secs(3);

/// One window's figures.
#[derive(Clone, Copy)]
struct Window {
    /// Median of the decode-only steps at batch 8, ms.
    step_ms: f64,
    /// How many such steps the window held.
    steps: usize,
    /// The daemon's CPU over the window, % of one core (None for "off").
    daemon_cpu_pct: Option<f64>,
    /// The daemon's RSS at the window's end, MiB.
    daemon_rss_mib: Option<f64>,
}

pub fn run() -> Result<()> {
    let Some(log) = server_log()? else {
        println!("\n(overhead skipped: no vLLM server; run `cargo xtask vllm up` first)");
        return Ok(());
    };
    let dir = fresh_dir("stallscope-bench-overhead")?;
    warm_up(&dir)?;

    let arms = [Arm::Off, Arm::Full, Arm::KernelOnly];
    let per_window = WINDOW + SETTLE * 2 + Duration::from_secs(15);
    let total = per_window * (ROUNDS * arms.len()) as u32 + Duration::from_secs(30);
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
        for round in 0..ROUNDS {
            for k in 0..arms.len() {
                let a = (round + k) % arms.len();
                windows[a].push(window(&dir, &log, arms[a])?);
            }
            if load.try_wait()?.is_some() {
                bail!("the steady load ended early");
            }
        }
        Ok(())
    })();
    let _ = load.kill();
    let _ = load.wait();
    result?;
    report(&arms, &windows);
    Ok(())
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
    let t = Instant::now();
    sleep(WINDOW);
    let wall = t.elapsed().as_secs_f64();
    let end = pid.and_then(cpu_and_rss);
    let text = std::fs::read(log)?;
    let tail = String::from_utf8_lossy(&text[from.min(text.len())..]);
    let (step_ms, steps) = crate::vllm_size::decode_step_b8(&tail)
        .context("no decode step at batch 8 in vLLM's log over a window")?;
    drop(daemon);
    sleep(SETTLE);
    // Clock ticks of 10 ms (USER_HZ 100).
    let daemon_cpu_pct = c0
        .zip(end)
        .map(|(c0, (c1, _))| c1.saturating_sub(c0) as f64 / wall);
    Ok(Window {
        step_ms,
        steps,
        daemon_cpu_pct,
        daemon_rss_mib: end.map(|(_, rss)| rss as f64 / 1024.0),
    })
}

fn report(arms: &[Arm], windows: &[Vec<Window>]) {
    println!("\n## Overhead on vLLM (cargo xtask bench --only overhead)\n");
    println!(
        "One steady load (8 requests at a time, 64 prompt and 128 output tokens); {ROUNDS} rounds of one {} s window per arm in rotating order.\n",
        WINDOW.as_secs()
    );
    println!("| round | arm | vLLM decode step at batch 8, median (ms) | steps | daemon CPU (% of a core) | daemon RSS (MiB) |\n|---|---|---|---|---|---|");
    let opt = |v: Option<f64>, p: usize| v.map_or("-".into(), |x| format!("{x:.p$}"));
    for round in 0..windows[0].len() {
        for (arm, w) in arms.iter().zip(windows) {
            let w = &w[round];
            println!(
                "| {} | {} | {:.2} | {} | {} | {} |",
                round + 1,
                arm.name(),
                w.step_ms,
                w.steps,
                opt(w.daemon_cpu_pct, 2),
                opt(w.daemon_rss_mib, 1)
            );
        }
    }
    println!();
    for (a, arm) in arms.iter().enumerate().skip(1) {
        let ratios: Vec<f64> = windows[a]
            .iter()
            .zip(&windows[0])
            .map(|(x, off)| x.step_ms / off.step_ms - 1.0)
            .collect();
        let (mean, half) = mean_ci95(&ratios);
        let mut sorted = ratios.clone();
        sorted.sort_by(f64::total_cmp);
        // A host's noise comes in episodes that can slow one window by 10 %: the median round
        // is the figure they move least.
        let median = sorted[sorted.len() / 2] / 2.0 + sorted[(sorted.len() - 1) / 2] / 2.0;
        let cpu: Vec<f64> = windows[a].iter().filter_map(|w| w.daemon_cpu_pct).collect();
        let rss = windows[a]
            .iter()
            .filter_map(|w| w.daemon_rss_mib)
            .fold(0.0, f64::max);
        println!(
            "{} vs off: vLLM's decode step {:+.2} % (95 % CI {:+.2} to {:+.2} %, {} rounds; median round {:+.2} %); daemon CPU {:.2} % of a core (mean), RSS max {rss:.1} MiB",
            arm.name(),
            100.0 * mean,
            100.0 * (mean - half),
            100.0 * (mean + half),
            ratios.len(),
            100.0 * median,
            cpu.iter().sum::<f64>() / cpu.len().max(1) as f64,
        );
    }
}
