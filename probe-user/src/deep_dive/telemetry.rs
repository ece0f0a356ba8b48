//! Host telemetry for deep dives, sampled on a thread at a fixed rate (≥ 100 Hz): per-CPU
//! utilisation (/proc/stat), per-CPU frequency (cpufreq, where the host has it), pressure
//! stall information (/proc/pressure), memory and paging (/proc/meminfo, /proc/vmstat), and
//! each GPU's NVML gauges where a driver is present.
//!
//! Cumulative counters become rates between consecutive samples. /proc/stat counts in
//! clock ticks (usually 10 ms), so one 10 ms utilisation sample is coarse; means over an
//! iteration or a window are what the analysis uses.

use std::{collections::BTreeMap, sync::atomic::Ordering, time::Duration};

use crate::{os::clock, os::worker::Worker};

/// One telemetry series.
#[derive(Debug, Clone, Default)]
pub struct Series {
    /// Unit shown with the counter track (`%`, `MHz`, `MiB`, `/s`).
    pub unit: &'static str,
    /// (CLOCK_MONOTONIC ns, value).
    pub points: Vec<(u64, f64)>,
}

/// Everything sampled, by series name.
#[derive(Debug, Default)]
pub struct Telemetry {
    /// Series by name, e.g. `cpu0.util`, `psi.memory.some`, `vm.pgmajfault`.
    pub series: BTreeMap<String, Series>,
    /// Samples taken.
    pub samples: u64,
    /// What could not be read on this host (once each).
    pub missing: Vec<String>,
}

impl Telemetry {
    /// Mean of `name` over [from, to).
    pub fn mean(&self, name: &str, from: u64, to: u64) -> Option<f64> {
        let s = self.series.get(name)?;
        let lo = s.points.partition_point(|p| p.0 < from);
        let hi = s.points.partition_point(|p| p.0 < to);
        let v = &s.points[lo..hi];
        (!v.is_empty()).then(|| v.iter().map(|p| p.1).sum::<f64>() / v.len() as f64)
    }
}

/// Starts sampling every `period` on a thread of its own; stopping it gives what was sampled.
pub fn start_sampler(period: Duration) -> Worker<Telemetry> {
    Worker::spawn("stallscope-telemetry", move |stop| {
        let mut t = Telemetry::default();
        let gpus = crate::gpu_plane::nvml::Gpus::open()
            .map_err(|e| t.missing.push(e))
            .ok();
        let mut readings = Vec::new();
        let mut prev = Raw::read(&mut t.missing);
        let mut next = std::time::Instant::now() + period;
        while !stop.load(Ordering::Acquire) {
            std::thread::sleep(next.saturating_duration_since(std::time::Instant::now()));
            next += period;
            let now = Raw::read(&mut t.missing);
            now.record_since(&prev, &mut t);
            if let Some(g) = &gpus {
                readings.clear();
                g.read(&mut readings);
                for (name, unit, v) in readings.drain(..) {
                    let s = t.series.entry(name).or_default();
                    s.unit = unit;
                    s.points.push((now.ts, v));
                }
            }
            t.samples += 1;
            prev = now;
        }
        t
    })
    .expect("spawning the telemetry thread")
}

/// One reading of every source.
struct Raw {
    ts: u64,
    /// Per CPU: (busy ticks, total ticks).
    cpus: Vec<(u64, u64)>,
    freq_khz: Vec<Option<u64>>,
    /// (resource, some total µs, full total µs).
    psi: Vec<(&'static str, u64, Option<u64>)>,
    meminfo: BTreeMap<&'static str, u64>,
    vmstat: BTreeMap<&'static str, u64>,
}

const MEMINFO: [(&str, &str); 5] = [
    ("MemTotal:", "mem.total"),
    ("MemAvailable:", "mem.available"),
    ("Dirty:", "mem.dirty"),
    ("Writeback:", "mem.writeback"),
    ("SwapFree:", "mem.swap_free"),
];
const VMSTAT: [&str; 7] = [
    "pgmajfault",
    "pswpin",
    "pswpout",
    "pgscan_direct",
    "pgscan_kswapd",
    "allocstall_normal",
    "pgsteal_direct",
];

impl Raw {
    fn read(missing: &mut Vec<String>) -> Raw {
        let ts = clock::monotonic_ns();
        let mut miss = |what: String| {
            if !missing.contains(&what) {
                missing.push(what);
            }
        };
        let cpus: Vec<(u64, u64)> = std::fs::read_to_string("/proc/stat")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("cpu") && l.as_bytes().get(3).is_some_and(u8::is_ascii_digit))
            .map(|l| {
                let v: Vec<u64> = l
                    .split_whitespace()
                    .skip(1)
                    .filter_map(|x| x.parse().ok())
                    .collect();
                let total: u64 = v.iter().take(8).sum();
                // idle + iowait are not busy.
                let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
                (total - idle, total)
            })
            .collect();
        let freq_khz: Vec<Option<u64>> = (0..cpus.len())
            .map(|i| {
                std::fs::read_to_string(format!(
                    "/sys/devices/system/cpu/cpu{i}/cpufreq/scaling_cur_freq"
                ))
                .ok()
                .and_then(|s| s.trim().parse().ok())
            })
            .collect();
        if freq_khz.iter().all(Option::is_none) {
            miss("cpufreq (no /sys/devices/system/cpu/cpu*/cpufreq: no frequency series)".into());
        }
        let mut psi = Vec::new();
        for res in ["cpu", "memory", "io"] {
            match std::fs::read_to_string(format!("/proc/pressure/{res}")) {
                Ok(text) => {
                    let total = |kind: &str| {
                        text.lines()
                            .find(|l| l.starts_with(kind))
                            .and_then(|l| l.rsplit("total=").next())
                            .and_then(|v| v.trim().parse::<u64>().ok())
                    };
                    psi.push((res, total("some").unwrap_or(0), total("full")));
                }
                Err(_) => miss(format!("/proc/pressure/{res} (PSI off in this kernel)")),
            }
        }
        let mut meminfo = BTreeMap::new();
        for line in std::fs::read_to_string("/proc/meminfo")
            .unwrap_or_default()
            .lines()
        {
            if let Some((_, name)) = MEMINFO.iter().find(|(k, _)| line.starts_with(k)) {
                if let Some(kb) = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()) {
                    meminfo.insert(*name, kb);
                }
            }
        }
        let mut vmstat = BTreeMap::new();
        for line in std::fs::read_to_string("/proc/vmstat")
            .unwrap_or_default()
            .lines()
        {
            let mut it = line.split_whitespace();
            if let (Some(k), Some(v)) = (it.next(), it.next()) {
                if let Some(name) = VMSTAT.iter().find(|n| **n == k) {
                    if let Ok(v) = v.parse() {
                        vmstat.insert(*name, v);
                    }
                }
            }
        }
        Raw {
            ts,
            cpus,
            freq_khz,
            psi,
            meminfo,
            vmstat,
        }
    }

    fn record_since(&self, prev: &Raw, t: &mut Telemetry) {
        let dt = self.ts.saturating_sub(prev.ts) as f64 / 1e9;
        if dt <= 0.0 {
            return;
        }
        let mut put = |name: String, unit: &'static str, v: f64| {
            let s = t.series.entry(name).or_default();
            s.unit = unit;
            s.points.push((self.ts, v));
        };
        let mut sum = 0.0;
        for (i, (now, before)) in self.cpus.iter().zip(&prev.cpus).enumerate() {
            let total = now.1.saturating_sub(before.1);
            let busy = now.0.saturating_sub(before.0);
            let util = if total == 0 {
                0.0
            } else {
                100.0 * busy as f64 / total as f64
            };
            sum += util;
            put(format!("cpu{i}.util"), "%", util);
        }
        if !self.cpus.is_empty() {
            put("cpu.util".into(), "%", sum / self.cpus.len() as f64);
        }
        for (i, f) in self.freq_khz.iter().enumerate() {
            if let Some(khz) = f {
                put(format!("cpu{i}.freq"), "MHz", *khz as f64 / 1e3);
            }
        }
        for ((res, some, full), (_, some0, full0)) in self.psi.iter().zip(&prev.psi) {
            // Stall µs per second of wall time, as a percentage.
            let pct = |a: u64, b: u64| a.saturating_sub(b) as f64 / 1e4 / dt;
            put(format!("psi.{res}.some"), "%", pct(*some, *some0));
            if let (Some(f), Some(f0)) = (full, full0) {
                put(format!("psi.{res}.full"), "%", pct(*f, *f0));
            }
        }
        for (name, kb) in self.meminfo.iter().filter(|(n, _)| **n != "mem.total") {
            put((*name).to_string(), "MiB", *kb as f64 / 1024.0);
        }
        // Memory in use (not available) as a share of all: what tells memory running short
        // from pages that are only read back slowly (deep_dive::analysis::category).
        if let (Some(&total), Some(&available)) = (
            self.meminfo.get("mem.total"),
            self.meminfo.get("mem.available"),
        ) {
            if total > 0 {
                let used = total.saturating_sub(available) as f64 / total as f64;
                put("mem.used".into(), "%", 100.0 * used);
            }
        }
        for (name, v) in &self.vmstat {
            if let Some(v0) = prev.vmstat.get(name) {
                put(
                    format!("vm.{name}"),
                    "/s",
                    v.saturating_sub(*v0) as f64 / dt,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_cpu_psi_and_memory_of_this_host() {
        let s = start_sampler(Duration::from_millis(10));
        // Keep one CPU busy so utilisation is visibly above zero.
        let end = std::time::Instant::now() + Duration::from_millis(300);
        let mut x = 0u64;
        while std::time::Instant::now() < end {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let t = s.stop().unwrap();
        assert!(t.samples >= 15, "{} samples in 300 ms at 100 Hz", t.samples);
        let util = t.mean("cpu.util", 0, u64::MAX).unwrap();
        assert!(util > 20.0 && util <= 100.0, "cpu.util {util}");
        assert!(t.series["mem.available"].points[0].1 > 0.0);
        assert!(t.series.contains_key("psi.cpu.some"));
        let used = t.series["mem.used"].points[0].1;
        assert!(used > 0.0 && used < 100.0, "{used}");
        assert!(!t.series.contains_key("mem.total"));
    }
}
