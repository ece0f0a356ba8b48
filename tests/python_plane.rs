//! End-to-end tests of the Python plane against real CPython 3.10–3.13 processes (pyenv): the `stallscope` binary
//! and the `pyframe-tracer` library attach to a running loop, time it and read its arguments. Need root.

use std::{
    collections::{BTreeMap, HashMap},
    io::{BufRead, Write},
    path::PathBuf,
    process::{ChildStdin, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use pyframe_tracer::{AttachOptions, Error, Framework, Session};
use serde_json::Value;

mod common;
use common::{
    cache_dir, expect_failure, expect_json, expect_success, python, require_root, stallscope,
    stallscope_unprivileged, Proc,
};

const VERSIONS: [&str; 4] = ["3.10", "3.11", "3.12", "3.13"];
const SPEC: &str =
    "__main__:Sched.run_batch[bs=len(batch.reqs);tokens=batch.tokens;seq=sum(batch.seq_lens);step=step]";

/// One call as the target itself stamped it.
#[derive(Debug, Clone, Copy)]
struct TargetCall {
    t0: u64,
    t1: u64,
    bs: i64,
    tokens: i64,
    seq: i64,
    result: i64,
}

/// A running `targets/py_loop.py`, killed on drop. Its stdout is parsed as it arrives.
struct Target {
    proc: Proc,
    stdin: Option<ChildStdin>,
    pid: i32,
    lines: Arc<Mutex<Vec<String>>>,
}

impl Target {
    fn start(version: &str, args: &[&str]) -> Target {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_loop.py");
        let mut cmd = Command::new(python(version));
        cmd.arg(script).args(args);
        Target::launch(cmd, version)
    }

    /// Debian sid's CPython 3.14, chrooted into the root `cargo xtask setup` builds (pyenv has
    /// no 3.14 here), with `env` set.
    fn start_314(args: &[&str], env: &[(&str, &str)]) -> Target {
        let root = cache_dir().join("sid-chroot");
        assert!(
            root.join("usr/bin/python3.14").exists(),
            "{} has no python3.14: run cargo xtask setup",
            root.display()
        );
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_loop.py");
        std::fs::copy(script, root.join("tmp/stallscope-py_loop.py")).unwrap();
        let mut cmd = Command::new("chroot");
        cmd.arg(&root)
            .args(["/usr/bin/python3.14", "/tmp/stallscope-py_loop.py"])
            .args(args)
            .envs(env.iter().copied());
        Target::launch(cmd, "3.14")
    }

    fn launch(mut cmd: Command, version: &str) -> Target {
        let (mut proc, first, reader) = Proc::spawn_ready(cmd.stdin(Stdio::piped()), "ready ");
        assert!(first.trim().ends_with(version), "{first}");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            for line in reader.lines().map_while(Result::ok) {
                sink.lock().unwrap().push(line);
            }
        });
        let stdin = proc.child().stdin.take();
        let pid = proc.id() as i32;
        Target {
            proc,
            stdin,
            pid,
            lines,
        }
    }

    fn calls(&self) -> HashMap<i64, TargetCall> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("call "))
            .map(|l| {
                let v: Vec<i64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
                let c = TargetCall {
                    t0: v[2] as u64,
                    t1: v[3] as u64,
                    bs: v[4],
                    tokens: v[5],
                    seq: v[6],
                    result: v[7],
                };
                (v[1], c)
            })
            .collect()
    }

    fn count(&self) -> usize {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("call "))
            .count()
    }

    /// Waits until the target made `n` more calls (so it demonstrably still runs).
    fn wait_progress(&self, n: usize) {
        let start = self.count();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.count() < start + n {
            assert!(
                Instant::now() < deadline,
                "target {} stopped making progress",
                self.pid
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The target's latest self-check: 1 when no trace of a probe is present.
    fn last_clean(&self) -> Option<bool> {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .rev()
            .find_map(|l| l.strip_prefix("clean "))
            .map(|l| l.ends_with(" 1"))
    }

    fn wait_clean_report(&self) -> bool {
        let before = self
            .lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.starts_with("clean "))
            .count();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = self
                .lines
                .lock()
                .unwrap()
                .iter()
                .filter(|l| l.starts_with("clean "))
                .count();
            if now > before {
                return self.last_clean().unwrap();
            }
            assert!(Instant::now() < deadline, "target reported nothing");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn alive(&mut self) -> bool {
        self.proc.child().try_wait().unwrap().is_none()
    }
}

fn probe_json(pid: i32, duration: &str, watch: &[&str]) -> Value {
    probe_json_by(pid, duration, watch, Writer::Native)
}

/// The probe's record writers: the compiled one (the default where the library is built, as
/// in every test run) and the pure-Python fallback (`STALLSCOPE_PYPROBE=`).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Writer {
    Native,
    Python,
}

impl Writer {
    const ALL: [Writer; 2] = [Writer::Native, Writer::Python];

    fn name(self) -> &'static str {
        match self {
            Writer::Native => "native",
            Writer::Python => "python",
        }
    }
}

/// `stallscope probe --json` with records written by `writer`; the report says which did.
fn probe_json_by(pid: i32, duration: &str, watch: &[&str], writer: Writer) -> Value {
    let mut cmd = stallscope();
    if writer == Writer::Python {
        cmd.env("STALLSCOPE_PYPROBE", "");
    }
    cmd.args(["probe", "--pid", &pid.to_string()])
        .args(["--duration", duration, "--json"]);
    for w in watch {
        cmd.args(["--watch", w]);
    }
    expect_json(&mut cmd)
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v[v.len() / 2]
}

/// Every call made while attached is captured (no gap in the step sequence), each record encloses the
/// target's own stamps within 20 µs median, and the extracted arguments equal what the target passed;
/// by each record writer, on a fresh target each.
fn check_capture(version: &str, mode: &str, min_calls: usize) {
    require_root();
    for writer in Writer::ALL {
        let target = Target::start(version, &[mode]);
        check_capture_on(&target, version, mode, min_calls, writer);
    }
}

/// [`check_capture`] on a running target by `writer`; returns the probe's report.
fn check_capture_on(
    target: &Target,
    version: &str,
    mode: &str,
    min_calls: usize,
    writer: Writer,
) -> Value {
    target.wait_progress(20);
    let report = probe_json_by(target.pid, "2s", &[SPEC], writer);
    assert_eq!(
        report["writer"],
        writer.name(),
        "{version} {mode}: the {} writer was asked for ({})",
        writer.name(),
        report["writer_note"]
    );
    target.wait_progress(5);
    let ours = target.calls();
    let calls = report["calls"].as_array().expect("calls in the report");
    assert_eq!(report["lost_records"], 0);
    assert!(
        calls.len() >= min_calls,
        "{version} {mode}: only {} calls captured",
        calls.len()
    );
    let mut steps: Vec<i64> = calls
        .iter()
        .map(|c| c["args"]["step"].as_i64().unwrap())
        .collect();
    steps.sort_unstable();
    assert!(
        steps.windows(2).all(|w| w[1] == w[0] + 1),
        "{version} {mode}: calls missing between {} and {}",
        steps[0],
        steps[steps.len() - 1]
    );
    let (mut enter_lag, mut exit_lag) = (Vec::new(), Vec::new());
    for c in calls {
        let step = c["args"]["step"].as_i64().unwrap();
        let t = ours
            .get(&step)
            .unwrap_or_else(|| panic!("target has no call {step}"));
        let (start, end) = (
            c["start_ns"].as_u64().unwrap(),
            c["end_ns"].as_u64().unwrap(),
        );
        assert!(
            start <= t.t0 && t.t1 <= end,
            "record {start}..{end} does not enclose {t:?}"
        );
        enter_lag.push((t.t0 - start) as i64);
        exit_lag.push((end - t.t1) as i64);
        assert_eq!(c["args"]["bs"], t.bs);
        assert_eq!(c["args"]["tokens"], t.tokens);
        assert_eq!(c["args"]["seq"], t.seq);
        assert_eq!(c["exception"], false);
        assert_eq!(c["tid"], target.pid as i64);
        assert_eq!(c["func"], "__main__:Sched.run_batch");
    }
    let (enter, exit) = (median(enter_lag), median(exit_lag));
    eprintln!(
        "{version} {mode} {}: {} calls, median enter lag {enter} ns, exit lag {exit} ns",
        writer.name(),
        calls.len()
    );
    assert!(
        enter < 20_000 && exit < 20_000,
        "{version}: median lags {enter} / {exit} ns"
    );
    report
}

/// CPython 3.14 (Debian sid's, in a chroot): every call captured exactly through PEP 768, which
/// stops no thread (pause 0), and, with PEP 768 turned off by the target's owner
/// (PYTHON_DISABLE_REMOTE_DEBUG), through the ptrace pending call instead (a pause above 0).
#[test]
fn captures_every_call_exactly_on_cpython_3_14_by_pep768_and_without_it() {
    require_root();
    for (route, env) in [
        ("pep768", None),
        ("pending call", Some(("PYTHON_DISABLE_REMOTE_DEBUG", "1"))),
    ] {
        let target = Target::start_314(&["sleep"], env.as_slice());
        let report = check_capture_on(&target, "3.14", "sleep", 300, Writer::Native);
        let pause = report["max_pause_us"].as_u64().unwrap();
        eprintln!("3.14 by {route}: longest pause {pause} µs");
        assert_eq!(report["python"].as_str().unwrap().get(..4), Some("3.14"));
        assert_eq!(
            pause == 0,
            env.is_none(),
            "3.14 by {route}: pause {pause} µs"
        );
    }
}

#[test]
fn captures_every_call_exactly_on_every_supported_version() {
    for version in VERSIONS {
        check_capture(version, "sleep", 300);
    }
}

/// A target that never sleeps: no thread is parked, so the injector catches one entering a syscall.
#[test]
fn attaches_to_a_busy_target() {
    check_capture("3.11", "busy", 200);
    check_capture("3.13", "busy", 200);
}

#[test]
fn multi_threaded_target_gets_one_lane_per_thread() {
    require_root();
    let target = Target::start("3.12", &["threads", "4"]);
    target.wait_progress(40);
    let report = probe_json(target.pid, "1s", &[SPEC]);
    let calls = report["calls"].as_array().unwrap();
    let mut by_tid: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for c in calls {
        by_tid
            .entry(c["tid"].as_u64().unwrap())
            .or_default()
            .push(c["args"]["step"].as_i64().unwrap());
    }
    assert_eq!(
        by_tid.len(),
        4,
        "one entry per worker thread: {:?}",
        by_tid.keys()
    );
    assert!(
        !by_tid.contains_key(&(target.pid as u64)),
        "the main thread never calls run_batch"
    );
    for (tid, mut steps) in by_tid {
        steps.sort_unstable();
        assert!(steps.len() >= 100, "thread {tid}: {} calls", steps.len());
        assert!(
            steps.windows(2).all(|w| w[1] == w[0] + 1),
            "thread {tid} has gaps"
        );
    }
}

/// A reader polling the ring as fast as it can while the probe writes ~10^5 records a second
/// never sees a lane's write sequence go backwards (the probe stores it in one piece) and reads
/// every record once: per lane, sequence numbers run on without a gap or a repeat.
#[test]
fn a_tight_reader_sees_whole_sequences_and_every_record_once() {
    require_root();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_bench.py");
    // The reader is kept: the target prints a line per round and dies of a closed pipe.
    let (target, _, _output) =
        Proc::spawn_ready(Command::new(python("3.12")).arg(script), "ready ");
    let pid = target.id() as i32;
    let session = Session::attach(
        pid,
        AttachOptions {
            specs: vec!["__main__:watched".parse().unwrap()],
            framework: Framework::Named("generic".into()),
            ..AttachOptions::default()
        },
    )
    .unwrap();
    let mut records = Vec::new();
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        session.drain(&mut records);
    }
    let resyncs = session.ring_resyncs();
    let lost = session.lost_records();
    session.detach().unwrap();
    eprintln!(
        "tight reader: {} records, {lost} lost, {resyncs} resyncs",
        records.len()
    );
    assert!(records.len() > 10_000, "{} records", records.len());
    assert_eq!(resyncs, 0, "a write sequence was seen going backwards");
    let mut by_tid: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for r in &records {
        by_tid.entry(r.tid).or_default().push(r.seq);
    }
    for (tid, seqs) in by_tid {
        assert!(
            seqs.windows(2).all(|w| w[1] == w[0] + 1),
            "thread {tid}: sequence numbers repeat or skip"
        );
    }
}

/// The doorbell: a reader that waits on it (no polling) is woken by every call of the chosen
/// function, finds that call's record already in the ring, and is not woken for calls of
/// other functions or once no function is chosen. On every supported version, so both ways of
/// timing calls (code swap, sys.monitoring) ring it. Prints how long after the call's end the
/// reader held its record (`doorbell:`).
#[test]
fn the_doorbell_rings_after_each_call_of_the_chosen_function_only() {
    require_root();
    for version in VERSIONS {
        let target = Target::start(version, &["sleep"]);
        let session = Session::attach(target.pid, attach_options()).unwrap();
        assert!(!session.ring_after(Some("__main__:Sched.nothing")));
        assert!(session.ring_after(Some("__main__:Sched.run_batch")));
        let bell = session.doorbell();
        let mut records = Vec::new();
        let mut lags = Vec::new();
        for _ in 0..200 {
            let seen = bell.load(std::sync::atomic::Ordering::Acquire);
            records.clear();
            session.drain(&mut records);
            let woken = sys_util::futex::wait_any(&[(bell, seen)], Duration::from_secs(2));
            let held = sys_util::clock::monotonic_ns();
            assert_eq!(
                woken,
                sys_util::futex::Woken::Rung,
                "{version}: no ring in 2 s"
            );
            records.clear();
            session.drain(&mut records);
            let last = records
                .last()
                .unwrap_or_else(|| panic!("{version}: woken with no record in the ring"));
            lags.push(held as i64 - last.exit_ns as i64);
        }
        // No function chosen: the calls go on, the bell stays as it was.
        session.ring_after(None);
        let before = bell.load(std::sync::atomic::Ordering::Acquire);
        target.wait_progress(50);
        assert_eq!(bell.load(std::sync::atomic::Ordering::Acquire), before);
        session.detach().unwrap();
        lags.sort_unstable();
        eprintln!(
            "doorbell: {version}: record held {} / {} / {} us after the call's end (p50 / p99 / max of 200)",
            lags[100] / 1000,
            lags[197] / 1000,
            lags[199] / 1000
        );
        assert!(
            lags[0] >= 0,
            "{version}: a record held before its call ended"
        );
    }
}

fn attach_options() -> AttachOptions {
    AttachOptions {
        specs: vec![SPEC.parse().unwrap()],
        framework: Framework::Named("generic".into()),
        ..AttachOptions::default()
    }
}

/// Attach/detach cycles on every supported version (3.14: Debian sid's, chrooted), 100 each here
/// (`STALLSCOPE_SOAK_CYCLES=1000` is the full soak, BENCHMARKS.md), on a target whose four
/// threads call the watched function busily, contending for the GIL: the target keeps running
/// with unchanged results, and afterwards nothing of the probe is left (its own self-check,
/// /dev/shm, its memory map, its file descriptors and threads). Each cycle's longest pause of
/// a target thread, attach and detach, is printed (`soak:` lines; the goal, 1 ms, is checked in
/// BENCHMARKS.md).
#[test]
fn attach_detach_cycles_leave_no_trace() {
    require_root();
    let cycles: usize = std::env::var("STALLSCOPE_SOAK_CYCLES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let count = |pid: i32, what: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{what}"))
            .unwrap()
            .count()
    };
    for version in VERSIONS.iter().chain(&["3.14"]) {
        let args = ["busy-threads", "4"];
        let mut target = match *version {
            "3.14" => Target::start_314(&args, &[]),
            v => Target::start(v, &args),
        };
        target.wait_progress(10);
        // The main thread and its four workers, all started.
        let limit = Instant::now() + Duration::from_secs(10);
        while count(target.pid, "task") < 5 {
            assert!(
                Instant::now() < limit,
                "{version}: the workers did not start"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        let (fds, threads) = (count(target.pid, "fd"), count(target.pid, "task"));
        // The main thread polls at nice 3 once its workers run, they at 0: each is left as it
        // was.
        let scheduling = loop {
            let now = common::thread_scheduling(target.pid as u32);
            if now
                .get(&target.pid.to_string())
                .is_some_and(|(_, nice)| nice == "3")
            {
                break now;
            }
            assert!(
                Instant::now() < limit,
                "{version}: the main thread's nice stayed {now:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut records = Vec::new();
        let mut pauses = Vec::with_capacity(cycles);
        for cycle in 0..cycles {
            let session = Session::attach(target.pid, attach_options())
                .unwrap_or_else(|e| panic!("{version} cycle {cycle}: {e}"));
            std::thread::sleep(Duration::from_millis(3));
            session.drain(&mut records);
            // The longest stop of the cycle, the attach's and the detach's.
            pauses.push(
                session
                    .detach()
                    .unwrap_or_else(|e| panic!("{version} cycle {cycle} detach: {e}")),
            );
        }
        pauses.sort();
        eprintln!(
            "soak: {version} {cycles} cycles, pause p50 {:?} p99 {:?} max {:?}",
            pauses[cycles / 2],
            pauses[cycles * 99 / 100],
            pauses[cycles - 1]
        );
        target.wait_progress(150);
        assert!(target.alive(), "{version}: target died");
        assert!(
            !records.is_empty(),
            "{version}: nothing recorded in {cycles} cycles"
        );
        for (step, c) in target.calls() {
            assert_eq!(
                c.result,
                (step * 2654435761 + c.bs) % 1000003,
                "{version}: output changed at {step}"
            );
        }
        assert!(
            target.wait_clean_report(),
            "{version}: probe traces remain after detach"
        );
        // Nothing mapped but the compiled writer, loaded once and reused by every later attach.
        let mapped = common::stallscope_mappings(target.pid as u32);
        assert!(mapped.is_empty(), "{version}: still mapped: {mapped:?}");
        let copies: Vec<_> = std::fs::read_dir("/tmp")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name().to_string_lossy().starts_with(&format!(
                    "{}{}-",
                    pyframe_tracer::native::COPY_PREFIX,
                    target.pid
                ))
            })
            .collect();
        assert!(copies.is_empty(), "{version}: {copies:?} left in /tmp");
        // Once the target reports itself clean, the probe has closed what it opened.
        let fd_list = || {
            std::fs::read_dir(format!("/proc/{}/fd", target.pid))
                .unwrap()
                .flatten()
                .map(|e| format!("{:?}", std::fs::read_link(e.path())))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            count(target.pid, "fd"),
            fds,
            "{version}: file descriptors left: {:?}",
            fd_list()
        );
        assert_eq!(
            count(target.pid, "task"),
            threads,
            "{version}: threads left"
        );
        let changed = common::scheduling_changed(target.pid as u32, &scheduling);
        assert!(changed.is_empty(), "{version}: {changed:?}");
        let leftovers: Vec<_> = std::fs::read_dir("/dev/shm")
            .unwrap()
            .flatten()
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .contains(&format!("stallscope-ring-{}-", target.pid))
            })
            .collect();
        assert!(
            leftovers.is_empty(),
            "{version}: {leftovers:?} left in /dev/shm"
        );
    }
}

/// One set of probes per process: a second session attaching while the first's lease is renewed
/// is refused with one clear error, and the first keeps recording; once the first detaches, a
/// new session attaches and instruments afresh.
#[test]
fn a_second_session_is_refused_while_the_first_holds_the_lease() {
    require_root();
    let target = Target::start("3.11", &["sleep"]);
    target.wait_progress(5);
    let first = Session::attach(target.pid, attach_options()).unwrap();
    assert!(first.probes[0].new);
    let e = match Session::attach(target.pid, attach_options()) {
        Ok(_) => panic!("a second session attached while the first held the lease"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("already watched by another stallscope") && e.contains("lease"),
        "{e}"
    );
    // The first session's probes are still installed and still write to its ring.
    let mut records = Vec::new();
    std::thread::sleep(Duration::from_millis(200));
    first.drain(&mut records);
    let since = sys_util::clock::monotonic_ns() - 150_000_000;
    assert!(
        records.iter().any(|r| r.exit_ns > since),
        "the first session stopped recording after the refused attach ({} records)",
        records.len()
    );
    first.detach().unwrap();
    let second = Session::attach(target.pid, attach_options()).unwrap();
    assert!(second.probes[0].new, "{:?}", second.probes);
    second.detach().unwrap();
    target.wait_progress(110);
    assert!(target.wait_clean_report());
}

/// A ring file left behind for a target (a daemon killed mid-attach: its lock is free) is
/// removed by the next attach to it, however young; one whose attach is still in flight (a
/// live process holds its lock) is kept.
#[test]
fn an_attach_removes_the_rings_left_behind_for_its_target() {
    require_root();
    let target = Target::start("3.12", &["sleep"]);
    target.wait_progress(5);
    let ring = |nonce: &str| {
        std::path::PathBuf::from(format!("/dev/shm/stallscope-ring-{}-{nonce}", target.pid))
    };
    let (left, in_flight) = (ring("dead1"), ring("beef2"));
    std::fs::write(&left, b"left behind").unwrap();
    std::fs::write(&in_flight, b"in flight").unwrap();
    let holder = std::fs::File::open(&in_flight).unwrap();
    // SAFETY: flock on an open descriptor, released when `holder` closes.
    let locked = unsafe {
        libc::flock(
            std::os::fd::AsRawFd::as_raw_fd(&holder),
            libc::LOCK_EX | libc::LOCK_NB,
        )
    };
    assert_eq!(locked, 0);
    let session = Session::attach(target.pid, attach_options()).unwrap();
    assert!(!left.exists(), "{} is still there", left.display());
    assert!(in_flight.exists(), "{} was removed", in_flight.display());
    session.detach().unwrap();
    drop(holder);
    std::fs::remove_file(&in_flight).unwrap();
}

/// The session keeps the probe's lease, not the draining: a reader that drains nothing for three
/// leases (held up, starved of CPU) keeps its probe, which goes on recording. A session dropped
/// without a detach (its process went away) lets the lease run out: the probe removes itself and
/// unmaps the ring.
#[test]
fn the_lease_outlives_a_slow_reader_and_runs_out_without_one() {
    require_root();
    let target = Target::start("3.12", &["sleep"]);
    target.wait_progress(5);
    let options = AttachOptions {
        lease: Duration::from_secs(1),
        ..attach_options()
    };
    let session = Session::attach(target.pid, options).unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        session.probe_attached(),
        "the probe removed itself while the session lived"
    );
    let mut records = Vec::new();
    session.drain(&mut records);
    let now = sys_util::clock::monotonic_ns();
    assert!(
        records.iter().any(|r| r.exit_ns > now - 500_000_000),
        "no record in the last 0.5 s of {}",
        records.len()
    );
    drop(session);
    let deadline = Instant::now() + Duration::from_secs(10);
    let probe_gone =
        || target.wait_clean_report() && common::stallscope_mappings(target.pid as u32).is_empty();
    while !probe_gone() {
        assert!(
            Instant::now() < deadline,
            "the probe stayed after its lease ran out"
        );
    }
}

/// `[start, end)` of every mapping of `pid`.
fn mappings(pid: i32) -> Vec<(u64, u64)> {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (a, b) = l.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(a, 16).ok()?,
                u64::from_str_radix(b, 16).ok()?,
            ))
        })
        .collect()
}

/// The pages mapped in `after` that were not in `before` (a new mapping may have merged with
/// a neighbour), as `[start, end)` ranges.
fn new_pages(before: &[(u64, u64)], after: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(start, end) in after {
        let mut cuts: Vec<(u64, u64)> = before
            .iter()
            .filter(|(s, e)| *s < end && *e > start)
            .map(|&(s, e)| (s.max(start), e.min(end)))
            .collect();
        cuts.sort();
        let mut at = start;
        for (s, e) in cuts {
            if s > at {
                out.push((at, s));
            }
            at = at.max(e);
        }
        if at < end {
            out.push((at, end));
        }
    }
    out
}

/// The first `n` bytes at `addr` in `pid`, or None when nothing is mapped there.
fn peek(pid: i32, addr: u64, n: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; n];
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    mem.read_exact_at(&mut buf, addr).ok().map(|()| buf)
}

/// The main thread is blocked in read(): the request cannot run and is cancelled (its region
/// now begins `if 0:`); when the thread later returns to Python the request does not run, the
/// region unmaps itself, and a later attach works.
#[test]
fn blocked_main_thread_is_reported_and_the_request_cancelled() {
    require_root();
    let mut target = Target::start("3.12", &["blocked"]);
    std::thread::sleep(Duration::from_millis(200));
    let options = AttachOptions {
        response_timeout: Duration::from_millis(500),
        ..attach_options()
    };
    let before = mappings(target.pid);
    match Session::attach(target.pid, options) {
        Err(Error::NotAtSafePoint { .. }) => {}
        other => panic!("expected NotAtSafePoint, got {:?}", other.map(|s| s.probes)),
    }
    let cancelled: Vec<(u64, u64)> = new_pages(&before, &mappings(target.pid))
        .into_iter()
        .filter(|&(start, _)| peek(target.pid, start, 5).as_deref() == Some(b"if 0:"))
        .collect();
    assert_eq!(
        cancelled.len(),
        1,
        "one new region holding the cancelled request: {:?}",
        new_pages(&before, &mappings(target.pid))
    );
    writeln!(target.stdin.as_mut().unwrap(), "go").unwrap();
    target.wait_progress(110);
    assert!(
        target.wait_clean_report(),
        "the cancelled request must not install anything"
    );
    let (start, _) = cancelled[0];
    assert_ne!(
        peek(target.pid, start, 5).as_deref(),
        Some(&b"if 0:"[..]),
        "the cancelled request's region at {start:#x} is still mapped"
    );
    let session = Session::attach(target.pid, attach_options()).unwrap();
    session.detach().unwrap();
    assert!(target.alive());
}

/// Processes the probe cannot attach to at all: each gets one error saying why.
#[test]
fn attach_refuses_processes_it_cannot_probe() {
    require_root();
    let mut not_python = Command::new("sleep");
    not_python.arg("30");
    let mut old_python = Command::new(python("3.9").parent().unwrap().join("python3.9"));
    old_python.args(["-c", "import time; time.sleep(30)"]);
    let cases: [(&str, Command, &[&str]); 2] = [
        ("not Python", not_python, &["is not a Python process"]),
        (
            "CPython 3.9",
            old_python,
            &["runs CPython 3.9", "does not support"],
        ),
    ];
    for (case, mut cmd, says) in cases {
        let mut child = cmd.spawn().unwrap();
        // Let the interpreter map its library.
        std::thread::sleep(Duration::from_millis(300));
        let err = expect_failure(stallscope().args([
            "probe",
            "--pid",
            &child.id().to_string(),
            "--watch",
            SPEC,
        ]));
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            says.iter().all(|s| err.contains(s)),
            "{case}: the error does not say {says:?}: {err}"
        );
    }
}

/// An attach that must fail: the target, what is done to it before and after, and what the
/// one error must say (the problem and the fix).
struct AttachError {
    case: &'static str,
    python: &'static str,
    mode: &'static str,
    watch: &'static str,
    /// Without CAP_SYS_PTRACE.
    unprivileged: bool,
    before: fn(&mut Target),
    after: fn(&mut Target),
    says: &'static [&'static str],
}

fn nothing(_: &mut Target) {}

#[test]
fn attach_errors_name_the_problem_and_the_fix() {
    require_root();
    let cases = [
        AttachError {
            case: "function not found",
            python: "3.13",
            mode: "sleep",
            watch: "__main__:Sched.run_btch",
            unprivileged: false,
            before: |t| t.wait_progress(3),
            after: |t| {
                // Nothing was left behind: the target runs on, clean.
                t.wait_progress(110);
                assert!(t.alive() && t.wait_clean_report());
            },
            says: &["not found", "close matches: run_batch"],
        },
        AttachError {
            case: "already traced",
            python: "3.11",
            mode: "sleep",
            watch: SPEC,
            unprivileged: false,
            before: |t| {
                // SAFETY: PTRACE_SEIZE of our own child; no memory is passed.
                let rc = unsafe { libc::ptrace(libc::PTRACE_SEIZE, t.pid, 0, 0) };
                assert_eq!(rc, 0);
            },
            after: nothing,
            says: &["already traced by pid", "detach that debugger"],
        },
        AttachError {
            case: "not permitted",
            python: "3.11",
            mode: "sleep",
            watch: SPEC,
            unprivileged: true,
            before: nothing,
            after: nothing,
            says: &["not permitted", "CAP_SYS_PTRACE"],
        },
        AttachError {
            case: "exits mid-attach",
            python: "3.12",
            mode: "exit-soon",
            watch: SPEC,
            unprivileged: false,
            before: nothing,
            after: |t| assert_eq!(t.proc.child().wait().unwrap().code(), Some(3)),
            says: &["exited while stallscope was attaching"],
        },
        AttachError {
            case: "stopped",
            python: "3.10",
            mode: "sleep",
            watch: SPEC,
            unprivileged: false,
            before: |t| {
                // SAFETY: a signal to our own child.
                unsafe { libc::kill(t.pid, libc::SIGSTOP) };
                std::thread::sleep(Duration::from_millis(100));
            },
            after: |t| {
                // SAFETY: as above.
                unsafe { libc::kill(t.pid, libc::SIGCONT) };
                t.wait_progress(5);
            },
            says: &["is stopped", "kill -CONT"],
        },
    ];
    for c in cases {
        let mut target = Target::start(c.python, &[c.mode]);
        (c.before)(&mut target);
        let mut cmd = if c.unprivileged {
            stallscope_unprivileged()
        } else {
            stallscope()
        };
        let err = expect_failure(cmd.args([
            "probe",
            "--pid",
            &target.pid.to_string(),
            "--watch",
            c.watch,
        ]));
        assert!(
            c.says.iter().all(|s| err.contains(s)),
            "{}: the error does not say {:?}: {err}",
            c.case,
            c.says
        );
        (c.after)(&mut target);
    }
}

/// `stallscope dump` samples every thread's Python stack with py-spy, without stopping the target.
#[test]
fn dump_shows_the_python_stacks() {
    require_root();
    let target = Target::start("3.12", &["threads", "2"]);
    target.wait_progress(10);
    let mut seen = false;
    for _ in 0..20 {
        let out =
            expect_success(stallscope().args(["dump", "--pid", &target.pid.to_string(), "--json"]));
        let threads: Value = serde_json::from_slice(&out).unwrap();
        let threads = threads.as_array().unwrap();
        assert_eq!(threads.len(), 3, "main + 2 workers: {threads:?}");
        seen |= threads.iter().any(|t| {
            t["frames"]
                .as_array()
                .unwrap()
                .iter()
                .any(|f| f["func"].as_str().unwrap().ends_with("run_batch"))
        });
        if seen {
            break;
        }
    }
    assert!(seen, "no sample caught a worker inside run_batch");
    target.wait_progress(5);
}
