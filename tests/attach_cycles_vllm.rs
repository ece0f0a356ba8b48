//! Attach/detach cycles of the Python plane on the real vLLM engine under load: `cargo xtask
//! test` runs 20 against its vLLM bring-up, `STALLSCOPE_VLLM_CYCLES=100` is the full count
//! (BENCHMARKS.md). Without a server (STALLSCOPE_VLLM) the test says so and does nothing.
//!
//! Each cycle attaches to the engine-core process with its framework found by the probe,
//! reads its records for a moment and detaches. What the test holds: every cycle attaches
//! (an attach refused because no thread reached a safe point is retried, and counted) and
//! detaches; the engine keeps stepping through the cycles (vLLM's own iteration log has no
//! gap over [`MAX_GAP_S`]) and serves requests afterwards; the probe's records are the
//! engine's steps; and nothing of stallscope is left in the engine (no mapping but the
//! compiled writer, which CPython cannot unload, no file descriptor or thread of ours, no ring
//! in its /dev/shm or /tmp, no library copy in its /tmp, each thread at the scheduling policy
//! and nice value it had). It prints each attach's wall time
//! and each cycle's longest stop of an engine thread (the 1 ms goal is checked in
//! BENCHMARKS.md; on a host the engine saturates it is missed).

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use pyframe_tracer::{AttachOptions, Error, Framework, Session};

mod common;
use common::vllm::{parse_log, unix_now};
use common::Proc;

/// Cycles, or STALLSCOPE_VLLM_CYCLES.
fn cycles() -> usize {
    std::env::var("STALLSCOPE_VLLM_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
}

/// How long each cycle stays attached.
const ATTACHED: Duration = Duration::from_millis(300);

/// The longest pause in vLLM's iteration log during the cycles that still counts as
/// "stepping" (seconds; the log stamps whole seconds). The load keeps 8 requests in flight,
/// so a healthy engine logs steps every second.
const MAX_GAP_S: u64 = 3;

/// How long a probe left by an earlier daemon may outlive it once the engine steps: its
/// lease (the default, 30 s) and a margin.
const LEASE_GONE: Duration = Duration::from_secs(45);

/// Attaches that may be refused in a row before the cycle fails.
const TRIES: usize = 3;

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() - 1) as f64 * p).round() as usize]
}

/// What of stallscope `pid` holds: its file descriptors and threads whose names are
/// stallscope's (files named `stallscope*` or `libstallscope*`, threads `stallscope*`), and its
/// mappings (the compiled writer left out; see [`common::stallscope_mappings`]).
fn ours(pid: u32) -> Vec<String> {
    let names = |what: &str, read: &dyn Fn(PathBuf) -> Option<String>| -> Vec<String> {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| read(e.path()))
                    .filter(|n| n.starts_with("stallscope") || n.starts_with("libstallscope"))
                    .map(|n| format!("{what}: {n}"))
                    .collect()
            })
            .unwrap_or_default()
    };
    // A file's name, not its directory's: the tests' own directories are named after
    // stallscope too.
    let mut found = names("fd", &|p| {
        let target = std::fs::read_link(p).ok()?;
        Some(target.file_name()?.to_string_lossy().into())
    });
    found.extend(names("task", &|p| {
        std::fs::read_to_string(p.join("comm")).ok()
    }));
    found.extend(common::stallscope_mappings(pid));
    found
}

/// An attach still running after [`SLOW_ATTACH`] prints what the attaching thread and its
/// children (the remote-call helper, the load) are doing in the kernel, once: where a slow
/// attach waits.
struct SlowAttachWatch {
    /// The cycle being attached and when its attach began; None between attaches.
    current: std::sync::Arc<std::sync::Mutex<Option<(usize, Instant)>>>,
}

const SLOW_ATTACH: Duration = Duration::from_secs(10);

impl SlowAttachWatch {
    fn start() -> SlowAttachWatch {
        let current = std::sync::Arc::new(std::sync::Mutex::new(None::<(usize, Instant)>));
        // SAFETY: gettid has no preconditions.
        let task = format!("/proc/self/task/{}", unsafe { libc::gettid() });
        let shared = current.clone();
        std::thread::spawn(move || {
            let mut reported = None;
            while std::sync::Arc::strong_count(&shared) > 1 {
                std::thread::sleep(Duration::from_secs(1));
                let Some((cycle, since)) = *shared.lock().unwrap() else {
                    continue;
                };
                if since.elapsed() < SLOW_ATTACH || reported == Some(cycle) {
                    continue;
                }
                reported = Some(cycle);
                eprintln!(
                    "cycle {cycle}: the attach has run {:.1?}; the attaching thread: {}{}{}",
                    since.elapsed(),
                    sys_util::task_state::doing(&task),
                    sys_util::task_state::children_doing(&task),
                    sys_util::task_state::cpu_contention()
                );
            }
        });
        SlowAttachWatch { current }
    }

    fn attaching(&self, cycle: usize) {
        *self.current.lock().unwrap() = Some((cycle, Instant::now()));
    }

    fn attached(&self) {
        *self.current.lock().unwrap() = None;
    }
}

/// What each thread of `pid` is doing and who traces it, a line each: what a failed attach
/// leaves to read.
fn threads_doing(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return " gone".into();
    };
    tasks
        .flatten()
        .map(|t| {
            let dir = t.path().to_string_lossy().into_owned();
            let status = std::fs::read_to_string(format!("{dir}/status")).unwrap_or_default();
            let tracer = pyframe_tracer::procfs::status_field(&status, "TracerPid").unwrap_or("?");
            format!(
                "\n  {} (traced by {tracer}): {}",
                t.file_name().to_string_lossy(),
                sys_util::task_state::doing(&dir)
            )
        })
        .collect()
}

/// The probe's ring files and library copies for `pid` in `dir` (named as
/// [`pyframe_tracer::reap::ring_pid`] reads them).
fn files_of(dir: &str, pid: u32) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| pyframe_tracer::reap::ring_pid(n) == Some(pid as i32))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn attach_detach_cycles_on_vllm_under_load() {
    let Some(server) = common::vllm::server("`cargo xtask test` brings vLLM up") else {
        return;
    };
    let pid = server["engine_pid"].as_u64().unwrap() as u32;
    let port = server["port"].to_string();
    let log_path = PathBuf::from(server["log"].as_str().unwrap());
    let xtask = PathBuf::from(std::env::var_os("STALLSCOPE_XTASK").expect("STALLSCOPE_XTASK"));
    let cycles = cycles();
    // An idle engine's main thread waits in a futex and cannot run the probe's requests.
    let load = Proc::spawn(
        Command::new(&xtask)
            .args(["vllm", "load", "--duration", "3600", "--concurrency", "8"])
            .args(["--port", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    // A daemon of an earlier test that stopped while the engine was idle could not have it run
    // the detach: that probe removes itself at its first call past its lease (30 s).
    let t = Instant::now();
    while !ours(pid).is_empty() {
        assert!(
            t.elapsed() < LEASE_GONE,
            "the engine still holds stallscope's {:?} after {LEASE_GONE:?} of load",
            ours(pid)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!(
        "the engine held nothing of stallscope's after {:.1?} of load",
        t.elapsed()
    );
    std::thread::sleep(Duration::from_secs(5));

    let scheduling = common::thread_scheduling(pid);
    let (mut pauses, mut walls) = (Vec::new(), Vec::new());
    let (mut records, mut steps, mut refused) = (Vec::new(), 0usize, Vec::new());
    let started = Instant::now();
    let from_unix = unix_now();
    let watch = SlowAttachWatch::start();
    // Attached as the daemon attaches, from a thread at the background reservation: at the
    // normal policy, beside the engine and its load saturating the CPUs, the attaching thread
    // at times waited 10 s to minutes for the tens of milliseconds of CPU an attach takes.
    eprintln!(
        "the attaching thread at the background reservation: {:?}",
        sys_util::sched::reserved()
    );
    for cycle in 0..cycles {
        let t = Instant::now();
        watch.attaching(cycle);
        let session = (1..=TRIES)
            .find_map(|attempt| {
                let options = AttachOptions {
                    framework: Framework::Auto,
                    ..AttachOptions::default()
                };
                let t = Instant::now();
                match Session::attach(pid as i32, options) {
                    Ok(s) => Some(s),
                    Err(e @ (Error::NoSafeThread { .. } | Error::NotAtSafePoint { .. }))
                        if attempt < TRIES =>
                    {
                        refused.push(format!("cycle {cycle}: {e}"));
                        None
                    }
                    Err(e) => panic!(
                        "cycle {cycle}, attempt {attempt}, after {:.1?}: {:#}\nthe engine's threads:{}",
                        t.elapsed(),
                        anyhow::Error::from(e),
                        threads_doing(pid)
                    ),
                }
            })
            .expect("the last attempt panics on failure");
        watch.attached();
        walls.push(t.elapsed());
        assert_eq!(session.framework.as_deref(), Some("vllm"), "cycle {cycle}");
        std::thread::sleep(ATTACHED);
        records.clear();
        session.drain(&mut records);
        steps += records
            .iter()
            .filter(|r| session.call(r).func.ends_with("EngineCore.step"))
            .count();
        // The longest stop of an engine thread over the cycle, attach and detach.
        let pause = session
            .detach()
            .unwrap_or_else(|e| panic!("cycle {cycle} detach: {:#}", anyhow::Error::from(e)));
        pauses.push(pause);
    }
    let took = started.elapsed();
    let to_unix = unix_now();
    eprintln!(
        "vllm cycles: {cycles} in {took:.1?}; attach wall p50 {:?} p99 {:?} max {:?}; longest stop of an engine thread per cycle p50 {:?} p99 {:?} max {:?}; {steps} steps recorded; {} attaches refused and retried{}",
        percentile(&mut walls, 0.5),
        percentile(&mut walls, 0.99),
        walls.last().unwrap(),
        percentile(&mut pauses, 0.5),
        percentile(&mut pauses, 0.99),
        pauses.last().unwrap(),
        refused.len(),
        refused
            .iter()
            .map(|r| format!("\n  {r}"))
            .collect::<String>()
    );
    assert!(
        steps >= cycles,
        "only {steps} EngineCore.step calls recorded in {cycles} cycles of {ATTACHED:?}"
    );

    // The engine stepped through the cycles: vLLM's own log.
    let stamps: Vec<u64> = parse_log(&log_path)
        .iter()
        .map(|l| l.unix_s)
        .filter(|s| (from_unix..=to_unix).contains(s))
        .collect();
    let gap = stamps
        .windows(2)
        .map(|w| w[1].saturating_sub(w[0]))
        .chain([
            stamps.first().map_or(u64::MAX, |s| s - from_unix),
            stamps.last().map_or(u64::MAX, |s| to_unix - s),
        ])
        .max()
        .unwrap();
    assert!(
        gap <= MAX_GAP_S,
        "vLLM logged no step for {gap} s during the cycles ({} steps logged from {from_unix} to {to_unix})",
        stamps.len()
    );
    drop(load);

    // It serves afterwards, and holds nothing of ours.
    let served = Command::new(&xtask)
        .args(["vllm", "load", "--duration", "10", "--concurrency", "2"])
        .args(["--port", &port])
        .output()
        .unwrap();
    assert!(
        served.status.success(),
        "vLLM failed requests after the cycles: {}",
        String::from_utf8_lossy(&served.stderr)
    );
    let left = ours(pid);
    assert!(left.is_empty(), "left in the engine: {left:?}");
    let changed = common::scheduling_changed(pid, &scheduling);
    assert!(changed.is_empty(), "scheduling changed: {changed:?}");
    // Rings go in its /dev/shm or /tmp, library copies in its /tmp.
    for dir in pyframe_tracer::reap::RING_DIRS {
        let dir = format!("/proc/{pid}/root{dir}");
        let left = files_of(&dir, pid);
        assert!(
            left.is_empty(),
            "rings or library copies left in {dir}: {left:?}"
        );
    }
}
