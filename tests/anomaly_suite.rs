//! `stallscope inject` against real processes: each CPU-side scenario produces its stress
//! (measured from /proc, cgroup files or the target's own report) and leaves nothing behind,
//! both when its time is up and when it is stopped with SIGTERM.

use std::{
    io::{BufRead, Read},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

mod common;
use common::{python, require_root, stallscope, tmpdir, Proc};

/// One line of the victim: (monotonic s, gen-2 collections, work ms, stalled flag).
type Line = (f64, u64, f64, bool);

/// The victim (tests/targets/py_victim.py) and the lines it prints:
/// (monotonic s, gen-2 collections, work ms, stalled flag).
struct Victim {
    proc: Proc,
    lines: Arc<Mutex<Vec<Line>>>,
}

impl Victim {
    fn start(cwd: &Path) -> Victim {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_victim.py");
        let (proc, _, out) = Proc::spawn_ready(
            Command::new(python("3.12")).arg(script).current_dir(cwd),
            "ready ",
        );
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for l in out.lines().map_while(Result::ok) {
                let f: Vec<&str> = l.split_whitespace().collect();
                if let [t, c, w, s] = f[..] {
                    sink.lock().unwrap().push((
                        t.parse().unwrap(),
                        c.parse().unwrap(),
                        w.parse().unwrap(),
                        s == "1",
                    ));
                }
            }
        });
        Victim { proc, lines }
    }

    fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// Waits (up to 15 s) until the lines printed from now on satisfy `ok`: the injection
    /// reached the victim, however long it took on this machine.
    fn wait_until(&self, what: &str, ok: impl Fn(&[Line]) -> bool) {
        let n = self.lines.lock().unwrap().len();
        let t = std::time::Instant::now();
        while !ok(&self.lines.lock().unwrap()[n..]) {
            assert!(
                t.elapsed() < Duration::from_secs(15),
                "no {what} within 15 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Lines printed from now on, for `d`.
    fn watch(&self, d: Duration) -> Vec<Line> {
        let n = self.lines.lock().unwrap().len();
        std::thread::sleep(d);
        self.lines.lock().unwrap()[n..].to_vec()
    }
}

/// Starts `stallscope inject SCENARIO [--pid P] [--intensity X] --duration D EXTRA...`.
fn inject(
    scenario: &str,
    pid: Option<u32>,
    intensity: Option<&str>,
    duration: &str,
    extra: &[&str],
) -> Child {
    let mut cmd = stallscope();
    cmd.args(["inject", scenario, "--duration", duration]);
    if let Some(pid) = pid {
        cmd.args(["--pid", &pid.to_string()]);
    }
    if let Some(x) = intensity {
        cmd.args(["--intensity", x]);
    }
    cmd.args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for the injector; asserts it succeeded; returns its stdout.
fn finish(c: Child) -> String {
    let out = c.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "inject failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// SIGTERM after `after`; the injector must exit (successfully) within 3 s.
fn terminate(mut c: Child, after: Duration) -> String {
    std::thread::sleep(after);
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
    let t = Instant::now();
    while c.try_wait().unwrap().is_none() {
        assert!(
            t.elapsed() < Duration::from_secs(3),
            "inject ignored SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    finish(c)
}

/// The Unix time minus CLOCK_MONOTONIC (the clock of Python's `time.monotonic()`), seconds.
fn unix_minus_monotonic_s() -> f64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    unix - sys_util::clock::monotonic_ns() as f64 * 1e-9
}

/// The fields of `/proc/PID/stat` after the command name: `[0]` is the state, `[7]` minflt,
/// `[11]` utime, `[12]` stime (proc(5), numbered from 3).
fn stat_fields(pid: u32) -> Vec<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    sys_util::task_state::stat_fields(&stat)
        .into_iter()
        .map(str::to_string)
        .collect()
}

/// CPU seconds `pid` used over `d` (utime + stime).
fn cpu_rate(pid: u32, d: Duration) -> f64 {
    let read = || -> u64 {
        let f = stat_fields(pid);
        f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
    };
    let a = read();
    std::thread::sleep(d);
    (read() - a) as f64 / 100.0 / d.as_secs_f64()
}

fn cpu_cgroup(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .lines()
        .find(|l| {
            l.split(':')
                .nth(1)
                .is_some_and(|c| c.split(',').any(|x| x == "cpu"))
                || l.starts_with("0::")
        })
        .unwrap()
        .to_string()
}

fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn list_names_every_scenario() {
    let out = common::expect_success(stallscope().args(["inject", "--list"]));
    let text = String::from_utf8_lossy(&out);
    for s in [
        "cpu-contention",
        "cpu-frequency",
        "memory-pressure",
        "memory-fragmentation",
        "io-contention",
        "network-delay",
        "python-gc-storm",
        "python-sync-stall",
        "process-pause",
    ] {
        assert!(text.contains(s), "{s} missing from:\n{text}");
    }
    let e = common::expect_failure(stallscope().args(["inject", "no-such-thing"]));
    assert!(e.contains("inject --list"), "{e}");
    let e = common::expect_failure(stallscope().args(["inject", "process-pause"]));
    assert!(e.contains("--pid"), "{e}");
}

#[test]
fn gpu_scenarios_refuse_clearly_without_a_gpu_or_permission() {
    let list = common::expect_success(stallscope().args(["inject", "--list"]));
    let list = String::from_utf8_lossy(&list);
    for s in [
        "gemm-contention",
        "pcie-saturation",
        "p2p-saturation",
        "clock-lock",
    ] {
        assert!(list.contains(s), "{s} not listed");
    }
    // This machine has no CUDA device (CI never has one).
    let e = common::expect_failure(stallscope().args([
        "inject",
        "gemm-contention",
        "--duration",
        "1s",
    ]));
    assert!(
        e.contains("no CUDA GPU") && e.contains("GPU machine"),
        "{e}"
    );
    // Clock locking never runs without the explicit flag.
    let e = common::expect_failure(stallscope().args(["inject", "clock-lock", "--duration", "1s"]));
    assert!(e.contains("--allow-device-settings"), "{e}");
}

/// The injector's own CPU time is measured, not the CPU's: what else runs on the host (a
/// build, another test's leftovers) neither helps nor hides it.
#[test]
fn cpu_contention_loads_its_cpus_until_the_deadline_or_sigterm() {
    require_root();
    let spinning = |pid: u32| {
        let t = Instant::now();
        while cpu_rate(pid, Duration::from_millis(100)) < 0.5 {
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "the injector did not start spinning within 10 s"
            );
        }
    };
    let c = inject("cpu-contention", None, Some("0.9"), "4s", &["--cpus", "1"]);
    spinning(c.id());
    let busy = cpu_rate(c.id(), Duration::from_secs(1));
    let report = finish(c);
    assert!(busy > 0.7, "the hog took {busy:.2} of CPU 1: {report}");
    assert!(report.contains("SCHED_FIFO"), "{report}");
    let c = inject("cpu-contention", None, Some("0.9"), "60s", &["--cpus", "1"]);
    let pid = c.id();
    spinning(pid);
    terminate(c, Duration::ZERO);
    // Its loops are threads of the process that exited (and was reaped): none runs on.
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the injector's process is still there after SIGTERM"
    );
}

#[test]
fn cpu_frequency_throttles_the_engine_and_restores_its_cgroup() {
    require_root();
    let dir = tmpdir("inject-cpufreq");
    let v = Victim::start(&dir);
    let pid = v.pid();
    let before = cpu_cgroup(pid);
    let free = cpu_rate(pid, Duration::from_secs(1));
    // A 20 ms engine step.
    let c = inject(
        "cpu-frequency",
        Some(pid),
        Some("0.95"),
        "3s",
        &["--engine-step", "20ms"],
    );
    std::thread::sleep(Duration::from_millis(500));
    let during_cg = cpu_cgroup(pid);
    let throttled = cpu_rate(pid, Duration::from_secs(1));
    let report = finish(c);
    assert!(
        during_cg.contains(&format!("stallscope-inject-{pid}")),
        "{during_cg}; {report}"
    );
    // A quarter of the step, 5 ms, lengthened where 5 % of the CPUs' time in it would be
    // under the kernel's smallest quota, 1 ms (two CPUs: 0.1 CPUs, so 10 ms).
    let cpus: f64 = report
        .split("(of ")
        .nth(1)
        .and_then(|r| r.split(')').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no CPU count in {report}"));
    let period_ms = (1.0 / (0.05 * cpus)).max(5.0);
    assert!(
        report.contains(&format!("per {period_ms:.1} ms")),
        "{report}"
    );
    assert!(
        throttled < 0.6 * free,
        "the victim used {free:.2} CPU free and {throttled:.2} throttled: {report}"
    );
    assert_eq!(cpu_cgroup(pid), before, "cgroup restored");
    let gone = |pid: u32| {
        !["/sys/fs/cgroup/cpu", "/sys/fs/cgroup"].iter().any(|r| {
            Path::new(r)
                .join(format!("stallscope-inject-{pid}"))
                .exists()
        })
    };
    assert!(gone(pid));
    let c = inject("cpu-frequency", Some(pid), None, "60s", &[]);
    terminate(c, Duration::from_secs(1));
    assert_eq!(cpu_cgroup(pid), before, "cgroup restored after SIGTERM");
    assert!(gone(pid));
}

#[test]
fn memory_pressure_takes_memory_and_gives_it_back() {
    require_root();
    let dir = tmpdir("inject-mem");
    let v = Victim::start(&dir);
    let before = mem_available_kib();
    let c = inject("memory-pressure", Some(v.pid()), Some("0.5"), "12s", &[]);
    // This VM hands out memory at about 0.4-1 GB/s, slower machines less: wait (almost to the
    // stress's end) until 1 GB is taken rather than for a fixed time.
    let t = Instant::now();
    let mut during = u64::MAX;
    while during + 1_000_000 >= before && t.elapsed() < Duration::from_millis(11_500) {
        during = during.min(mem_available_kib());
        std::thread::sleep(Duration::from_millis(100));
    }
    let report = finish(c);
    std::thread::sleep(Duration::from_millis(500));
    let after = mem_available_kib();
    assert!(
        during + 1_000_000 < before,
        "MemAvailable {before} kB before, {during} kB at the lowest during: {report}"
    );
    assert!(
        (after as f64) > 0.9 * before as f64,
        "MemAvailable {after} kB after (before {before})"
    );
    let c = inject("memory-pressure", Some(v.pid()), Some("0.3"), "60s", &[]);
    terminate(c, Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(500));
    assert!((mem_available_kib() as f64) > 0.9 * before as f64);
}

#[test]
fn memory_fragmentation_churns_the_allocator() {
    require_root();
    let c = inject("memory-fragmentation", None, Some("0.5"), "1500ms", &[]);
    let pid = c.id();
    std::thread::sleep(Duration::from_millis(1000));
    let minflt: u64 = stat_fields(pid)[7].parse().unwrap();
    let report = finish(c);
    assert!(minflt > 10_000, "{minflt} minor faults: {report}");
    assert!(report.contains("allocate/free cycles"), "{report}");
}

#[test]
fn io_contention_writes_syncs_pages_the_engine_out_then_removes_its_files() {
    require_root();
    let dir = tmpdir("inject-io");
    let v = Victim::start(&dir);
    let scratch = |d: &Path| {
        std::fs::read_dir(d)
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".stallscope-io-")
            })
            .count()
    };
    let c = inject("io-contention", Some(v.pid()), Some("0.25"), "2s", &[]);
    let pid = c.id();
    std::thread::sleep(Duration::from_millis(1200));
    let files = scratch(&dir);
    let mut io = String::new();
    std::fs::File::open(format!("/proc/{pid}/io"))
        .unwrap()
        .read_to_string(&mut io)
        .unwrap();
    let written: u64 = io
        .lines()
        .find_map(|l| l.strip_prefix("write_bytes:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let report = finish(c);
    assert!(
        files >= 1,
        "no scratch file in the engine's directory: {report}"
    );
    assert!(written > 1 << 20, "{written} bytes written: {report}");
    // The victim's file-backed pages were paged out while the writers held the disk.
    let paged = report
        .split_once("paged out ")
        .and_then(|(_, r)| r.split_once(" times (")?.1.split_once(" MiB advised)"))
        .map(|(mib, _)| mib.parse::<u64>().unwrap());
    assert!(paged.is_some_and(|mib| mib > 0), "no page-out: {report}");
    assert_eq!(scratch(&dir), 0, "scratch files left behind");
    let c = inject("io-contention", Some(v.pid()), None, "60s", &[]);
    terminate(c, Duration::from_secs(1));
    assert_eq!(scratch(&dir), 0, "scratch files left behind after SIGTERM");
}

#[test]
fn network_delay_touches_only_loopback_and_always_removes_its_qdisc() {
    require_root();
    let qdiscs = || {
        String::from_utf8_lossy(
            &Command::new("tc")
                .args(["qdisc", "show", "dev", "lo"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned()
    };
    let before = qdiscs();
    let out = stallscope()
        .args(["inject", "network-delay", "--port", "9", "--duration", "1s"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    // Hosts without sch_netem (this one) get one clear error; either way nothing stays.
    assert!(out.status.success() || stderr.contains("netem"), "{stderr}");
    assert_eq!(qdiscs(), before, "loopback qdiscs changed");
}

#[test]
fn python_gc_storm_runs_collections_inside_the_engine() {
    require_root();
    let dir = tmpdir("inject-gc");
    let v = Victim::start(&dir);
    let c = inject("python-gc-storm", Some(v.pid()), Some("0.5"), "4s", &[]);
    v.wait_until("collection", |l| {
        l.len() > 1 && l.last().unwrap().1 > l.first().unwrap().1
    });
    let during = v.watch(Duration::from_secs(1));
    let report = finish(c);
    std::thread::sleep(Duration::from_millis(300));
    let after = v.watch(Duration::from_secs(1));
    let collections = |l: &[Line]| l.last().unwrap().1 - l.first().unwrap().1;
    assert!(
        collections(&during) >= 10,
        "{} full collections in 1 s: {report}",
        collections(&during)
    );
    assert!(
        collections(&after) <= 1,
        "the storm went on: {}",
        collections(&after)
    );
}

#[test]
fn python_sync_stall_slows_the_function_and_puts_it_back() {
    require_root();
    let dir = tmpdir("inject-stall");
    let v = Victim::start(&dir);
    let stall = |duration| {
        inject(
            "python-sync-stall",
            Some(v.pid()),
            Some("0.5"),
            duration,
            &["--function", "__main__:Worker.work"],
        )
    };
    // The victim's own pace first: the stall adds 10 ms to a call of a few ms.
    let mut usual: Vec<f64> = v
        .watch(Duration::from_millis(500))
        .iter()
        .map(|l| l.2)
        .collect();
    usual.sort_by(f64::total_cmp);
    let usual = usual[usual.len() / 2];
    // From the last line before the injection, which is unstalled.
    let seen = v.lines.lock().unwrap().len() - 1;
    let c = inject(
        "python-sync-stall",
        Some(v.pid()),
        Some("0.5"),
        "4s",
        &["--function", "__main__:Worker.work", "--json"],
    );
    v.wait_until("stalled call", |l| l.iter().any(|l| l.3));
    // The call that was running when the stall went in may end unstalled.
    std::thread::sleep(Duration::from_millis(100));
    let during = v.watch(Duration::from_millis(800));
    let report = finish(c);
    // The interval an evaluation labels starts when the wrapper is in place, not when the
    // injector started (it then waited for the victim's safe point): after the victim's last
    // line without the wrapper and by its first line with it (the lines come every 100 ms; the
    // onset is taken once the injector has detached, a few ms after the wrapper went in).
    let json: serde_json::Value = serde_json::from_str(report.trim()).expect(&report);
    let onset = json["started_unix_us"].as_f64().unwrap() / 1e6 - unix_minus_monotonic_s();
    let lines = v.lines.lock().unwrap()[seen..].to_vec();
    let first = lines.iter().position(|l| l.3).expect("a stalled line");
    assert!(first > 0, "{lines:?}");
    let (before, after) = (lines[first - 1].0, lines[first].0);
    assert!(
        before <= onset && onset <= after + 0.05,
        "onset {onset:.3} not between the last unstalled line {before:.3} and the first stalled {after:.3} (setup {} ms)",
        json["setup_ms"]
    );
    std::thread::sleep(Duration::from_millis(300));
    let after = v.watch(Duration::from_millis(500));
    assert!(
        during.iter().all(|l| l.3 && l.2 >= 9.0),
        "{during:?}: {report}"
    );
    assert!(
        after.iter().all(|l| !l.3 && l.2 < usual + 5.0),
        "not put back (usual call {usual:.1} ms): {after:?}"
    );
    let c = stall("60s");
    v.wait_until("stalled call", |l| l.iter().any(|l| l.3));
    std::thread::sleep(Duration::from_millis(100));
    assert!(v.watch(Duration::from_millis(300)).iter().all(|l| l.3));
    terminate(c, Duration::ZERO);
    std::thread::sleep(Duration::from_millis(300));
    let after = v.watch(Duration::from_millis(500));
    assert!(
        after.iter().all(|l| !l.3),
        "not put back after SIGTERM: {after:?}"
    );
}

#[test]
fn process_pause_stops_the_engine_and_always_continues_it() {
    require_root();
    let dir = tmpdir("inject-pause");
    let v = Victim::start(&dir);
    let pid = v.pid();
    let state = || stat_fields(pid).swap_remove(0);
    let c = inject("process-pause", Some(pid), Some("0.5"), "2s", &[]);
    std::thread::sleep(Duration::from_millis(200));
    let mut stopped = 0;
    for _ in 0..100 {
        stopped += usize::from(state() == "T");
        std::thread::sleep(Duration::from_millis(10));
    }
    let report = finish(c);
    assert!(stopped >= 20, "stopped in {stopped}/100 samples: {report}");
    assert_ne!(state(), "T");
    let c = inject("process-pause", Some(pid), Some("0.9"), "60s", &[]);
    terminate(c, Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(100));
    assert_ne!(state(), "T", "left stopped after SIGTERM");
    assert!(
        !v.watch(Duration::from_millis(300)).is_empty(),
        "the victim runs again"
    );
}
