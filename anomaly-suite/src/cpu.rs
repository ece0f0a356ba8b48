//! CPU scenarios: contention (vector FMA/sqrt loops on the engine's CPUs) and a lower CPU
//! speed (cpufreq ceiling, or a cgroup CPU quota where the host has no cpufreq).

use std::{
    path::{Path, PathBuf},
    sync::atomic::AtomicBool,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{
    allowed_cpus, cgroup, duty_period, each_period, hold, pin, realtime, threads, Onset, Params,
};

/// The contention loops' duty-cycle period without the engine's step ([`duty_period`]).
const PERIOD: Duration = Duration::from_millis(60);

/// The CFS period of the quota without the engine's step ([`duty_period`]): Kubernetes'.
const QUOTA_PERIOD: Duration = Duration::from_millis(100);

/// Loops pinned to each CPU, spinning `intensity` of every period ([`duty_period`]) at
/// SCHED_FIFO 1 (a SCHED_OTHER loop in its own autogroup may get no time at all next to a
/// busy engine).
pub fn contention(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let cpus = if p.cpus.is_empty() {
        allowed_cpus(p.pid)
    } else {
        p.cpus.clone()
    };
    let period = duty_period(p, PERIOD);
    let spin = period.mul_f64(p.intensity);
    let deadline = Instant::now() + p.duration;
    let fifo = std::sync::atomic::AtomicUsize::new(0);
    threads(cpus.len(), deadline, stop, |i, deadline, stop| {
        // Real-time first: once pinned next to a busy engine, a SCHED_OTHER thread in its own
        // autogroup can wait tens of seconds for the CPU time to make that call.
        if realtime() {
            fifo.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        pin(cpus[i]);
        onset.now();
        each_period(period, deadline, stop, |t| {
            std::hint::black_box(spin_until((t + spin).min(deadline)));
        });
    });
    Ok(format!(
        "{} loops ({}) on CPUs {cpus:?}, {} at SCHED_FIFO 1, spinning {:.1} ms of every {:.1} ms",
        cpus.len(),
        vector_kind(),
        fifo.into_inner(),
        spin.as_secs_f64() * 1e3,
        period.as_secs_f64() * 1e3
    ))
}

fn vector_kind() -> &'static str {
    if std::arch::is_x86_feature_detected!("avx512f") {
        "AVX-512"
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        "AVX2+FMA"
    } else {
        "scalar"
    }
}

/// FMA/sqrt on the widest vectors the CPU has, until `t`.
fn spin_until(t: Instant) -> f64 {
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F (checked above).
        return unsafe { spin_avx512(t) };
    }
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has AVX2 and FMA (checked above).
        return unsafe { spin_avx2(t) };
    }
    let (mut a, mut c) = (1.0001f64, 1.0f64);
    while Instant::now() < t {
        for _ in 0..1000 {
            c = a.mul_add(0.9999, c);
            a = c.sqrt();
        }
    }
    a
}

#[target_feature(enable = "avx512f")]
fn spin_avx512(t: Instant) -> f64 {
    use std::arch::x86_64::*;
    let (mut a, b, mut c) = (
        _mm512_set1_pd(1.0001),
        _mm512_set1_pd(0.9999),
        _mm512_set1_pd(1.0),
    );
    while Instant::now() < t {
        for _ in 0..1000 {
            c = _mm512_fmadd_pd(a, b, c);
            a = _mm512_sqrt_pd(c);
        }
    }
    _mm512_reduce_add_pd(a)
}

#[target_feature(enable = "avx2,fma")]
fn spin_avx2(t: Instant) -> f64 {
    use std::arch::x86_64::*;
    let (mut a, b, mut c) = (
        _mm256_set1_pd(1.0001),
        _mm256_set1_pd(0.9999),
        _mm256_set1_pd(1.0),
    );
    while Instant::now() < t {
        for _ in 0..1000 {
            c = _mm256_fmadd_pd(a, b, c);
            a = _mm256_sqrt_pd(c);
        }
    }
    let mut out = [0.0f64; 4];
    // SAFETY: out has room for 4 doubles; storeu has no alignment requirement.
    unsafe { _mm256_storeu_pd(out.as_mut_ptr(), a) };
    out.iter().sum()
}

/// cpufreq's per-CPU directories, if the host has cpufreq.
fn cpufreq_dirs() -> Vec<PathBuf> {
    (0..1024)
        .map(|c| PathBuf::from(format!("/sys/devices/system/cpu/cpu{c}/cpufreq")))
        .take_while(|d| d.parent().is_some_and(Path::exists))
        .filter(|d| d.join("scaling_max_freq").exists())
        .collect()
}

fn read_khz(p: &Path) -> Result<u64> {
    std::fs::read_to_string(p)
        .with_context(|| format!("reading {}", p.display()))?
        .trim()
        .parse()
        .with_context(|| format!("parsing {}", p.display()))
}

/// Lowers the CPU speed the engine sees by `intensity`: the cpufreq ceiling of every CPU
/// where cpufreq exists, else a CPU quota of (1 − intensity) of the engine's CPUs through
/// its cgroup, over a CFS period of [`duty_period`] (a slower CPU slows every step alike;
/// a quota of 100 ms periods would stop a 30 ms engine for whole steps).
pub fn frequency(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let deadline = Instant::now() + p.duration;
    let dirs = cpufreq_dirs();
    if !dirs.is_empty() {
        let mut saved = Vec::new();
        let mut result = Ok(());
        for d in &dirs {
            let max = d.join("scaling_max_freq");
            let (now, hw_max, hw_min) = match (
                read_khz(&max),
                read_khz(&d.join("cpuinfo_max_freq")),
                read_khz(&d.join("cpuinfo_min_freq")),
            ) {
                (Ok(a), Ok(b), Ok(c)) => (a, b, c),
                _ => continue,
            };
            let target = ((hw_max as f64 * (1.0 - p.intensity)) as u64).max(hw_min);
            match std::fs::write(&max, target.to_string()) {
                Ok(()) => saved.push((max, now)),
                Err(e) => {
                    result = Err(e).with_context(|| format!("writing {}", max.display()));
                    break;
                }
            }
        }
        if result.is_ok() {
            onset.now();
            hold(deadline, stop);
        }
        for (path, khz) in &saved {
            let _ = std::fs::write(path, khz.to_string());
        }
        result?;
        return Ok(format!(
            "cpufreq: scaling_max_freq lowered to {:.0} % of the maximum on {} CPUs, restored after",
            100.0 * (1.0 - p.intensity),
            saved.len()
        ));
    }
    let cpus = allowed_cpus(Some(pid)).len() as f64;
    let quota = (cpus * (1.0 - p.intensity)).max(0.01);
    let guard = cgroup::CpuQuota::apply(pid, quota, duty_period(p, QUOTA_PERIOD))?;
    onset.now();
    let mechanism = format!(
        "no cpufreq on this host: CPU quota of {quota:.2} CPUs (of {cpus}) per {:.1} ms on the engine's process tree through {}",
        guard.period().as_secs_f64() * 1e3,
        guard.describe()
    );
    hold(deadline, stop);
    guard.undo()?;
    Ok(mechanism)
}
