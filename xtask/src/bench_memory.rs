//! `cargo xtask bench --only memory`: whether the daemon's memory stays flat over a long run
//! attached to vLLM under steady load, with what a long run brings: refits, reference
//! recordings, alerts and a deep dive every 10 minutes. Samples the daemon's RSS (with its
//! anonymous and file-backed parts: code pages first run late in a run stay resident, which is
//! no leak), its heap (allocated and free, from its metrics), open file descriptors and
//! threads every 10 s. `STALLSCOPE_MEMORY_SOAK_S` sets the length (default
//! one hour).

use std::{
    process::{Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::bench_sentinel::{fresh_dir, start_daemon, xtask_bin, Arm};

/// Time between samples.
const SAMPLE: Duration = Duration::from_secs(10);
/// Time between requested deep dives.
const DEEP_DIVE_EVERY: Duration = Duration::from_secs(600);
/// Samples before this are the start-up (attach, first fit); the trend is taken after it.
const SETTLED: Duration = Duration::from_secs(300);

/// One sample of the daemon.
struct Sample {
    at_s: f64,
    rss_mib: f64,
    /// Anonymous and file-backed parts of the RSS, MiB.
    anon_mib: f64,
    file_mib: f64,
    /// The heap's allocated and free bytes, MiB (`stallscope_daemon_heap_bytes`).
    heap_mib: Option<(f64, f64)>,
    fds: usize,
    threads: u64,
}

fn sample(pid: u32, at_s: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key| crate::bench_sentinel::status_number(&status, key);
    Some(Sample {
        at_s,
        rss_mib: field("VmRSS")? as f64 / 1024.0,
        anon_mib: field("RssAnon")? as f64 / 1024.0,
        file_mib: field("RssFile")? as f64 / 1024.0,
        heap_mib: crate::bench_sentinel::metrics().and_then(|m| {
            let heap = |state: &str| {
                let key = format!("stallscope_daemon_heap_bytes{{state=\"{state}\"}} ");
                let line = m.lines().find(|l| l.starts_with(&key))?;
                Some(line[key.len()..].trim().parse::<f64>().ok()? / (1 << 20) as f64)
            };
            Some((heap("in_use")?, heap("free")?))
        }),
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count(),
        threads: field("Threads")?,
    })
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (mx, my) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x / n, b + y / n));
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx).powi(2))
    });
    num / den.max(f64::MIN_POSITIVE)
}

pub fn run() -> Result<()> {
    let Some(server) = crate::bench_sentinel::server_state()? else {
        println!("\n(memory soak skipped: no vLLM server; run `cargo xtask vllm up` first)");
        return Ok(());
    };
    let engine = server["engine_pid"].as_u64().context("no engine pid")?;
    let length =
        Duration::from_secs(crate::env_count("STALLSCOPE_MEMORY_SOAK_S", 3600, "seconds")? as u64);
    let dir = fresh_dir("stallscope-bench-memory")?;
    let mut load = Command::new(xtask_bin())
        .args(["vllm", "load", "--concurrency", "8", "--seed", "777"])
        .arg("--duration")
        .arg((length + Duration::from_secs(120)).as_secs().to_string())
        .stdout(Stdio::null())
        .spawn()?;
    let result = (|| -> Result<(Vec<Sample>, usize, usize)> {
        let daemon = start_daemon(&dir, Arm::Full)?;
        let pid = daemon.0.id();
        let t = Instant::now();
        let (mut samples, mut dives, mut refused) = (Vec::new(), 0, 0);
        let mut next_dive = DEEP_DIVE_EVERY;
        while t.elapsed() < length {
            sleep(SAMPLE);
            let at = t.elapsed();
            samples.push(sample(pid, at.as_secs_f64()).context("the daemon is gone")?);
            if at >= next_dive {
                next_dive += DEEP_DIVE_EVERY;
                let body = format!(r#"{{"pid": {engine}, "duration_s": 5}}"#);
                let r = sys_util::http::request(
                    9477,
                    "POST",
                    "/api/v1/deep-dive",
                    "",
                    &body,
                    Duration::from_secs(30),
                )?;
                match r.status {
                    202 => dives += 1,
                    // The daemon's own cap ([deep_dive] max_per_hour), which its alerts' deep
                    // dives count against too: part of a long run, not a failure of it.
                    429 => refused += 1,
                    _ => bail!("deep dive refused ({}): {}", r.status, r.body),
                }
            }
            if load.try_wait()?.is_some() {
                bail!("the steady load ended early");
            }
        }
        drop(daemon);
        Ok((samples, dives, refused))
    })();
    let _ = load.kill();
    let _ = load.wait();
    let (samples, dives, refused) = result?;
    report(&samples, dives, refused, length);
    Ok(())
}

fn report(samples: &[Sample], dives: usize, refused: usize, length: Duration) {
    println!("\n## Daemon memory over a long run (cargo xtask bench --only memory)\n");
    println!(
        "{:.0} minutes attached to vLLM under `vllm load --concurrency 8`, {dives} requested deep dives taken, {refused} refused by the hourly cap; every 5 minutes:\n",
        length.as_secs_f64() / 60.0
    );
    println!("| minute | RSS (MiB) | anonymous / file-backed (MiB) | heap allocated / free (MiB) | fds | threads |\n|---|---|---|---|---|---|");
    let mut next = 0.0;
    for s in samples {
        if s.at_s >= next {
            println!(
                "| {:.0} | {:.1} | {:.1} / {:.1} | {} | {} | {} |",
                s.at_s / 60.0,
                s.rss_mib,
                s.anon_mib,
                s.file_mib,
                s.heap_mib
                    .map_or("-".into(), |(a, f)| format!("{a:.1} / {f:.1}")),
                s.fds,
                s.threads
            );
            next += 300.0;
        }
    }
    let settled: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.at_s >= SETTLED.as_secs_f64())
        .collect();
    let (Some(first), Some(last)) = (settled.first(), settled.last()) else {
        println!("\n(too short to settle: no trend)");
        return;
    };
    let rss: Vec<(f64, f64)> = settled.iter().map(|s| (s.at_s, s.rss_mib)).collect();
    let max = settled.iter().map(|s| s.rss_mib).fold(0.0, f64::max);
    // Captures hold their event ring for seconds: the floor of each 10 minutes is what stays.
    let mut floors: Vec<(f64, f64)> = Vec::new();
    for s in &settled {
        let bucket = (s.at_s / 600.0).floor() * 600.0 + 300.0;
        match floors.last_mut() {
            Some((at, min)) if *at == bucket => *min = min.min(s.rss_mib),
            _ => floors.push((bucket, s.rss_mib)),
        }
    }
    let floor_text: Vec<String> = floors.iter().map(|(_, m)| format!("{m:.1}")).collect();
    println!(
        "\nafter minute {:.0}: RSS {:.1} MiB -> {:.1} MiB at the end, max {max:.1} MiB, trend {:+.2} MiB per hour; lowest RSS of each 10 minutes {} MiB (trend {:+.2} MiB per hour); fds {} -> {}, threads {} -> {}",
        SETTLED.as_secs_f64() / 60.0,
        first.rss_mib,
        last.rss_mib,
        slope(&rss) * 3600.0,
        floor_text.join(", "),
        if floors.len() > 1 { slope(&floors) * 3600.0 } else { f64::NAN },
        first.fds,
        last.fds,
        first.threads,
        last.threads
    );
    // What the daemon holds apart from what its allocator keeps: a leak grows the allocated
    // heap, retention by the allocator only the free part.
    let series = |of: fn(&Sample) -> Option<f64>| -> Vec<(f64, f64)> {
        settled
            .iter()
            .filter_map(|s| Some((s.at_s, of(s)?)))
            .collect()
    };
    let drift = |points: &[(f64, f64)]| match (points.first(), points.last()) {
        (Some(a), Some(b)) => format!(
            "{:.1} -> {:.1} MiB (trend {:+.2} MiB per hour)",
            a.1,
            b.1,
            slope(points) * 3600.0
        ),
        _ => "-".into(),
    };
    println!(
        "after minute {:.0}: anonymous RSS {}; file-backed RSS {}; heap allocated {}, free {}",
        SETTLED.as_secs_f64() / 60.0,
        drift(&series(|s| Some(s.anon_mib))),
        drift(&series(|s| Some(s.file_mib))),
        drift(&series(|s| Some(s.heap_mib?.0))),
        drift(&series(|s| Some(s.heap_mib?.1))),
    );
}
