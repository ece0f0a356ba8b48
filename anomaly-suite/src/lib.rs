//! Anomaly injectors and detection scoring.
//!
//! Every injector starts its stress, holds it until the deadline or until `stop` is set, and
//! undoes it before returning, whatever happened: helper threads are joined, cgroups emptied
//! and removed, files deleted, qdiscs deleted, stopped processes continued. What a scenario
//! did is returned as a [`Report`], so callers can say which mechanism was used.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use serde::Serialize;

pub mod cgroup;
mod cpu;
mod gpu;
mod io;
mod memory;
mod network;
mod pause;
mod python;
pub mod reclaim;
pub mod score;

/// What to inject into.
#[derive(Debug, Clone)]
pub struct Params {
    /// How long to hold the stress.
    pub duration: Duration,
    /// Severity in (0, 1]: its meaning is given per scenario.
    pub intensity: f64,
    /// CPUs to stress (cpu-contention; empty: the target's allowed CPUs, else all).
    pub cpus: Vec<usize>,
    /// The engine process (required by the scenarios that act on it).
    pub pid: Option<u32>,
    /// The engine's API port (network-delay).
    pub port: Option<u16>,
    /// `MODULE:QUALNAME` of the function to slow (python-sync-stall).
    pub function: Option<String>,
    /// Allow scenarios that change device settings (clock-lock).
    pub allow_device_settings: bool,
    /// The engine's own decode step, when known: magnitudes that are times (python-sync-stall's
    /// sleep) are then set relative to it, so an intensity slows a 20 ms and a 150 ms engine
    /// alike.
    pub step: Option<Duration>,
}

/// What an injection did.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// The scenario.
    pub scenario: String,
    /// The mechanism used and its settings, in words.
    pub mechanism: String,
    /// How long the stress was held, from its onset.
    pub held_ms: f64,
    /// How long the scenario took to set up before its stress took hold (waiting for the
    /// engine's safe point, creating a cgroup, ...).
    pub setup_ms: f64,
    /// When the stress took hold and when it was undone (µs since the Unix epoch): the
    /// injection interval an evaluation labels, without the process start and exit and the
    /// setup before the onset, in which nothing acts on the engine yet.
    pub started_unix_us: f64,
    /// See `started_unix_us`.
    pub ended_unix_us: f64,
}

fn unix_us() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// The moment a scenario's stress takes hold. A scenario marks it when it first acts on the
/// engine or the resources it shares (a loop spins, a pause stops it, code injected into it
/// runs); what comes before (finding processes, waiting for the engine's safe point, making a
/// cgroup) acts on nothing. The first mark counts; a scenario that never marks (the GPU ones,
/// whose PyTorch child says nothing when it starts) is taken to act from its call.
#[derive(Default)]
pub(crate) struct Onset(std::sync::OnceLock<(Instant, f64)>);

impl Onset {
    /// Marks the stress as in force from now, unless it already was.
    pub(crate) fn now(&self) {
        let _ = self.0.get_or_init(|| (Instant::now(), unix_us()));
    }
}

/// One scenario of the suite.
pub struct Scenario {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it stresses, one line.
    pub stresses: &'static str,
    /// What `intensity` means for it.
    pub intensity: &'static str,
    /// The root-cause category a deep dive should report for it, when it has one.
    pub cause: Option<&'static str>,
    /// Whether it needs `--pid`.
    pub needs_pid: bool,
    run: fn(&Params, &AtomicBool, &Onset) -> Result<String>,
}

/// Root-cause category of CPU contention (as deep-dive reports name it).
pub const CPU: &str = "CPU contention";
/// Root-cause category of memory pressure.
pub const MEMORY: &str = "memory pressure";
/// Root-cause category of I/O contention.
pub const IO: &str = "I/O contention";

/// Every scenario (the GPU ones need a GPU machine with PyTorch).
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "cpu-contention",
        stresses: "CPU time: AVX-512 (else AVX2) FMA/sqrt loops pinned to the engine's CPUs, at SCHED_FIFO priority 1",
        intensity: "fraction of each period each loop spins (a quarter of an engine step with --engine-step, at most 60 ms)",
        cause: Some(CPU),
        needs_pid: false,
        run: cpu::contention,
    },
    Scenario {
        name: "cpu-frequency",
        stresses: "CPU speed: lowers the cpufreq ceiling, or (no cpufreq, as in VMs) throttles the engine with a cgroup CPU quota",
        intensity: "fraction of the engine's CPU capacity taken away (a quota's period: a quarter of an engine step with --engine-step, at most 100 ms)",
        cause: Some(CPU),
        needs_pid: true,
        run: cpu::frequency,
    },
    Scenario {
        name: "memory-pressure",
        stresses: "memory: takes anonymous memory, drops the page cache, pushes the engine into reclaim (memory.high on cgroup v2, its file-backed pages paged out elsewhere)",
        intensity: "fraction of MemAvailable taken (at most 80 %)",
        cause: Some(MEMORY),
        needs_pid: true,
        run: memory::pressure,
    },
    Scenario {
        name: "memory-fragmentation",
        stresses: "the allocator and page allocator: many allocate/free cycles of random sizes on every CPU",
        intensity: "fraction of each CPU spent allocating (in periods of a quarter of an engine step with --engine-step, at most 60 ms)",
        cause: Some(MEMORY),
        needs_pid: false,
        run: memory::fragmentation,
    },
    Scenario {
        name: "io-contention",
        stresses: "storage: fsync-heavy writers on the engine's filesystem while its file-backed pages are paged out, so it reads them back through the busy disk",
        intensity: "write size per fsync (0..1 of 4 MiB), writer count, and page-outs per second (0..1 of 10)",
        cause: Some(IO),
        needs_pid: true,
        run: io::contention,
    },
    Scenario {
        name: "network-delay",
        stresses: "the engine's API traffic: netem delay and loss on loopback, for its API port only",
        intensity: "delay (0..1 of 50 ms) and loss (0..1 of 2 %)",
        cause: None,
        needs_pid: false,
        run: network::delay,
    },
    Scenario {
        name: "python-gc-storm",
        stresses: "the engine's interpreter: a thread in it makes cyclic garbage and runs full collections",
        intensity: "collections per second (0..1 of 100)",
        cause: None,
        needs_pid: true,
        run: python::gc_storm,
    },
    Scenario {
        name: "python-sync-stall",
        stresses: "one engine function: a bounded sleep added to every call of it (--function, default the profile's schedule step)",
        intensity: "sleep per call (0..1 of two engine steps with --engine-step, else of 20 ms)",
        cause: None,
        needs_pid: true,
        run: python::sync_stall,
    },
    Scenario {
        name: "process-pause",
        stresses: "the whole engine: short SIGSTOP/SIGCONT pauses (a hang)",
        intensity: "fraction of every 6 engine steps with --engine-step (else of every 200 ms) the engine is stopped",
        cause: None,
        needs_pid: true,
        run: pause::pauses,
    },
    Scenario {
        name: "gemm-contention",
        stresses: "the GPU's SMs: a competing bf16 GEMM loop on cuda:0 (PyTorch; a GPU machine)",
        intensity: "fraction of every 100 ms the loop runs",
        cause: None,
        needs_pid: false,
        run: gpu::gemm_contention,
    },
    Scenario {
        name: "pcie-saturation",
        stresses: "the host link: pinned host<->device copies of 256 MiB (PyTorch; a GPU machine)",
        intensity: "fraction of every 100 ms spent copying",
        cause: None,
        needs_pid: false,
        run: gpu::pcie_saturation,
    },
    Scenario {
        name: "p2p-saturation",
        stresses: "the GPU-to-GPU link: cuda:0<->cuda:1 copies (PyTorch; two GPUs)",
        intensity: "fraction of every 100 ms spent copying",
        cause: None,
        needs_pid: false,
        run: gpu::p2p_saturation,
    },
    Scenario {
        name: "clock-lock",
        stresses: "GPU speed: locks GPU 0's graphics clock low with nvidia-smi (refused without --allow-device-settings)",
        intensity: "fraction of the supported clock range taken away",
        cause: None,
        needs_pid: false,
        run: gpu::clock_lock,
    },
];

/// The scenario named `name`.
pub fn scenario(name: &str) -> Result<&'static Scenario> {
    SCENARIOS.iter().find(|s| s.name == name).ok_or_else(|| {
        anyhow::anyhow!(
            "no scenario named {name:?}: `stallscope inject --list` names them ({})",
            SCENARIOS
                .iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
                .join(", ")
        )
    })
}

impl Scenario {
    /// Runs the scenario until `params.duration` has passed or `stop` is set, and undoes it.
    pub fn run(&self, params: &Params, stop: &AtomicBool) -> Result<Report> {
        if !(params.intensity > 0.0 && params.intensity <= 1.0) {
            bail!("--intensity must be in (0, 1], got {}", params.intensity);
        }
        if params.step.is_some_and(|s| s.is_zero()) {
            bail!("--engine-step must be longer than 0 (the engine's decode step, such as 25ms)");
        }
        if self.needs_pid && params.pid.is_none() {
            bail!("{} acts on the engine: give its pid with --pid", self.name);
        }
        if let Some(pid) = params.pid {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                bail!("no process with pid {pid}: check the engine's pid");
            }
        }
        let called = (Instant::now(), unix_us());
        let onset = Onset::default();
        let mechanism = (self.run)(params, stop, &onset)?;
        let (t, started_unix_us) = *onset.0.get().unwrap_or(&called);
        Ok(Report {
            scenario: self.name.to_string(),
            mechanism,
            held_ms: t.elapsed().as_secs_f64() * 1e3,
            setup_ms: t.duration_since(called.0).as_secs_f64() * 1e3,
            started_unix_us,
            ended_unix_us: unix_us(),
        })
    }
}

/// The shortest period of a duty-cycled stress: a SCHED_FIFO timer and the CFS bandwidth
/// timer keep to it on a busy host.
const MIN_DUTY_PERIOD: Duration = Duration::from_millis(4);

/// The period of a stress that is on for a share of each period (cpu-contention's loops,
/// memory-fragmentation's churn, the quota of cpu-frequency without cpufreq): a quarter of
/// the engine's step when it is known, never more than `fallback` (the period without it).
/// Shorter than a step, every step the stress overlaps loses the same share of its time: with
/// a period of several steps some steps would lose a whole burst and others nothing, so the
/// same intensity would slow a fast engine's steps unevenly and a slow engine's evenly.
pub(crate) fn duty_period(p: &Params, fallback: Duration) -> Duration {
    p.step
        .map_or(fallback, |s| (s / 4).clamp(MIN_DUTY_PERIOD, fallback))
}

/// Calls `burst(start)` at the start of every `period` until `deadline` or until `stop` is
/// set, and waits out the rest of each period: a duty-cycled stress's loop, whose burst keeps
/// to its share of the period (and to `deadline`) itself.
pub(crate) fn each_period(
    period: Duration,
    deadline: Instant,
    stop: &AtomicBool,
    mut burst: impl FnMut(Instant),
) {
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        burst(t);
        hold((t + period).min(deadline), stop);
    }
}

/// Sleeps in short steps until `deadline` or until `stop` is set; true if the deadline came.
pub(crate) fn hold(deadline: Instant, stop: &AtomicBool) -> bool {
    while Instant::now() < deadline {
        if stop.load(Ordering::Relaxed) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5).min(deadline - Instant::now()));
    }
    true
}

/// Runs `n` copies of `work(i, deadline, stop)` on threads and joins them all.
pub(crate) fn threads(
    n: usize,
    deadline: Instant,
    stop: &AtomicBool,
    work: impl Fn(usize, Instant, &AtomicBool) + Sync,
) {
    std::thread::scope(|s| {
        for i in 0..n {
            let work = &work;
            s.spawn(move || work(i, deadline, stop));
        }
    });
}

/// The CPUs `pid` may run on (its main thread's affinity), or every online CPU.
pub fn allowed_cpus(pid: Option<u32>) -> Vec<usize> {
    let list = pid
        .and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok())
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|v| v.trim().to_string())
        })
        .or_else(|| std::fs::read_to_string("/sys/devices/system/cpu/online").ok());
    list.map(|l| parse_cpu_list(l.trim()).unwrap_or_default())
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| (0..num_cpus()).collect())
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// Parses a CPU list such as `0-3,6`.
pub fn parse_cpu_list(s: &str) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (usize, usize) = match (a.parse(), b.parse()) {
            (Ok(a), Ok(b)) if a <= b => (a, b),
            _ => bail!("bad CPU list {s:?}: write it like 0-3,6"),
        };
        out.extend(a..=b);
    }
    Ok(out)
}

/// Every pid of `pid`'s process tree (it and its descendants).
pub fn process_tree(pid: u32) -> Vec<u32> {
    let parent = |p: u32| -> Option<u32> {
        let stat = std::fs::read_to_string(format!("/proc/{p}/stat")).ok()?;
        sys_util::task_state::stat_fields(&stat)
            .get(1)?
            .parse()
            .ok()
    };
    let all: Vec<(u32, Option<u32>)> = std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .map(|p| (p, parent(p)))
                .collect()
        })
        .unwrap_or_default();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(all.iter().filter(|(_, pp)| *pp == Some(p)).map(|(c, _)| *c));
        i += 1;
    }
    tree
}

/// Puts the calling thread in SCHED_FIFO at priority 1, so it runs when it wants to even on
/// CPUs the engine keeps busy; false if the kernel refused.
pub(crate) fn realtime() -> bool {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; param is valid for the call.
    unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) == 0 }
}

/// Pins the calling thread to `cpu`.
pub(crate) fn pin(cpu: usize) -> bool {
    sys_util::sched::set_affinity(0, &std::collections::BTreeSet::from([cpu])).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_and_scenario_lookup() {
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        assert!(parse_cpu_list("3-1").is_err());
        assert!(scenario("cpu-contention").is_ok());
        let e = scenario("nope").err().unwrap().to_string();
        assert!(e.contains("process-pause"), "{e}");
        let names: std::collections::BTreeSet<_> = SCENARIOS.iter().map(|s| s.name).collect();
        assert_eq!(names.len(), SCENARIOS.len());
    }

    #[test]
    fn duty_periods_follow_the_engine_step_within_bounds() {
        let ms = Duration::from_millis;
        // (engine step, fallback, period)
        let cases = [
            (None, ms(60), ms(60)),
            (Some(ms(32)), ms(60), ms(8)),
            (Some(ms(150)), ms(60), Duration::from_micros(37_500)),
            (Some(ms(150)), ms(100), Duration::from_micros(37_500)),
            (Some(ms(10)), ms(60), MIN_DUTY_PERIOD),
            (Some(ms(2_000)), ms(60), ms(60)),
        ];
        for (step, fallback, want) in cases {
            let p = Params {
                duration: ms(1),
                intensity: 0.5,
                cpus: Vec::new(),
                pid: None,
                port: None,
                function: None,
                allow_device_settings: false,
                step,
            };
            assert_eq!(duty_period(&p, fallback), want, "step {step:?}");
        }
    }
}
