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

/// Load runs per arm of the A/B comparison.
const PAIRS: usize = 4;
/// Requests per load run.
const REQUESTS: &str = "48";

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
    Ok(())
}

fn xtask_bin() -> PathBuf {
    crate::root().join("target/release/xtask")
}

/// One bounded load run; its output tokens per second.
fn load_run(seed: usize) -> Result<f64> {
    let out = Command::new(xtask_bin())
        .args([
            "vllm",
            "load",
            "--requests",
            REQUESTS,
            "--concurrency",
            "8",
            "--seed",
        ])
        .arg(seed.to_string())
        .stderr(Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("load run failed");
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(text.lines().last().context("no summary")?)?;
    v["output_tokens_per_s"]
        .as_f64()
        .with_context(|| format!("no throughput in {v}"))
}

/// utime + stime of a process, in clock ticks, and its RSS in KiB.
fn cpu_and_rss(pid: u32) -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let f: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let ticks = f[11].parse::<u64>().ok()? + f[12].parse::<u64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches(" kB")
        .parse()
        .ok()?;
    Some((ticks, rss))
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child.
        unsafe { libc::kill(self.0.id() as i32, libc::SIGTERM) };
        let _ = self.0.wait();
    }
}

fn start_daemon(dir: &std::path::Path) -> Result<Daemon> {
    let log = std::fs::File::create(dir.join("daemon.log"))?;
    let child = Command::new(crate::stallscope_bin())
        .args(["run", "--listen", "127.0.0.1:9477", "--state-dir"])
        .arg(dir)
        .stderr(log)
        .spawn()?;
    Ok(Daemon(child))
}

fn metrics() -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect("127.0.0.1:9477").ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").ok()?;
    let mut r = String::new();
    s.read_to_string(&mut r).ok()?;
    Some(r)
}

/// The q-quantile of a Prometheus histogram (linear inside the bucket).
fn histogram_quantile(text: &str, name: &str, q: f64) -> Option<f64> {
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
    let total = buckets.last()?.1;
    let want = q * total;
    let mut prev = (0.0, 0.0);
    for &(le, c) in &buckets {
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

fn vllm_overhead() -> Result<()> {
    let state =
        std::path::PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
            .join(".cache/stallscope/vllm-run/server.json");
    if !state.exists() {
        println!("\n(vLLM part skipped: no server; run `cargo xtask vllm up` first)");
        return Ok(());
    }
    let dir = std::env::temp_dir().join("stallscope-bench-sentinel");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    // Warm the engine, then attach once (the probes stay installed while the daemon runs; the
    // "off" arm runs with the daemon stopped and the probes removed).
    load_run(100)?;
    let (mut on, mut off) = (Vec::new(), Vec::new());
    let (mut cpu_s, mut wall_s, mut rss_max) = (0.0, 0.0, 0u64);
    let hz = 100.0;
    for i in 0..PAIRS {
        // Every run gets its own prompts (vLLM's prefix cache would favour a repeated set), and
        // the arms alternate which goes first.
        let (seed_off, seed_on) = (1000 + 2 * i, 1001 + 2 * i);
        if i % 2 == 0 {
            off.push(load_run(seed_off)?);
        }
        let d = start_daemon(&dir)?;
        // Attach happens once the engine is busy: the first requests of the run.
        let t = Instant::now();
        let c0 = cpu_and_rss(d.0.id()).map_or(0, |c| c.0);
        let tp = load_run(seed_on)?;
        let (c1, rss) = cpu_and_rss(d.0.id()).unwrap_or((c0, 0));
        cpu_s += (c1 - c0) as f64 / hz;
        wall_s += t.elapsed().as_secs_f64();
        rss_max = rss_max.max(rss);
        on.push(tp);
        if i + 1 == PAIRS {
            let m = metrics().unwrap_or_default();
            let p50 = histogram_quantile(&m, "stallscope_verdict_latency_seconds", 0.5);
            let p99 = histogram_quantile(&m, "stallscope_verdict_latency_seconds", 0.99);
            println!("\n## Sentinel on vLLM (cargo xtask bench --only sentinel)\n");
            println!(
                "verdict latency (iteration end -> verdict, the moment an alert is raised): p50 {:.0} us, p99 {:.0} us",
                p50.unwrap_or(f64::NAN) * 1e6,
                p99.unwrap_or(f64::NAN) * 1e6
            );
        }
        drop(d);
        std::thread::sleep(Duration::from_secs(2));
        if i % 2 == 1 {
            off.push(load_run(seed_off)?);
        }
    }
    let mut ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    ratios.sort_by(f64::total_cmp);
    println!("| pair | off tok/s | on tok/s | on/off |\n|---|---|---|---|");
    for (i, (a, b)) in on.iter().zip(&off).enumerate() {
        println!("| {} | {b:.1} | {a:.1} | {:.4} |", i + 1, a / b);
    }
    println!(
        "median throughput ratio (on/off): {:.4}; daemon CPU {:.2} % of one core while attached; RSS max {} MiB",
        ratios[ratios.len() / 2],
        100.0 * cpu_s / wall_s,
        rss_max / 1024
    );
    Ok(())
}
