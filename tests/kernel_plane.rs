//! End-to-end tests of the kernel plane: the real `stallscope` binary, real eBPF in the
//! running kernel, real workload processes. They need root (CI runs as root).

use std::{
    io::{BufRead, BufReader, Read, Write},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

mod common;
use common::{
    expect_failure, expect_json, json_of, require_root, stallscope, stallscope_unprivileged, Proc,
};

/// A running workload process, killed on drop, and what it announced (its pid and tids).
struct Workload {
    proc: Proc,
    info: Value,
}

impl Workload {
    fn start(args: &[&str]) -> Self {
        let (proc, line, _) = Proc::spawn_ready(
            Command::new(env!("CARGO_BIN_EXE_stallscope-workload"))
                .args(args)
                .stdin(Stdio::piped()),
            "{",
        );
        let info = serde_json::from_str(&line).expect("workload announces itself");
        Self { proc, info }
    }

    fn pid(&self) -> u32 {
        self.info["pid"].as_u64().unwrap() as u32
    }

    fn tid(&self, name: &str) -> u32 {
        self.info[name].as_u64().unwrap() as u32
    }
}

/// (on-CPU ns, run-queue wait ns) from the kernel's own accounting.
fn schedstat(pid: u32, tid: u32) -> (u64, u64) {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/schedstat")).unwrap();
    let v: Vec<u64> = s.split_whitespace().map(|x| x.parse().unwrap()).collect();
    (v[0], v[1])
}

/// The report's entry for thread `tid`.
fn thread(report: &Value, tid: u32) -> &Value {
    report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tid"] == tid)
        .unwrap_or_else(|| panic!("thread {tid} missing from {report}"))
}

fn assert_close(what: &str, ours: u64, kernel: u64) {
    let diff = ours.abs_diff(kernel) as f64;
    let tolerance = (kernel as f64 * 0.05).max(1e6);
    assert!(
        diff <= tolerance,
        "{what}: stallscope {ours} ns vs kernel schedstat {kernel} ns (diff {diff} > {tolerance})"
    );
}

/// On-CPU and run-queue wait agree with /proc/PID/task/TID/schedstat within 5 % on a busy
/// thread and a sleeping thread that share a CPU with a pinned CPU hog, with the hooks this
/// kernel takes (tp_btf) and with the raw_tracepoint fallback forced (`--hooks`).
#[test]
fn accounting_matches_kernel_schedstat() {
    require_root();
    for (hooks, kind) in [("auto", "TpBtf"), ("raw-tracepoint", "RawTracepoint")] {
        eprintln!("--hooks {hooks}");
        accounting_matches_kernel_schedstat_with(hooks, kind);
    }
}

/// The check above with `--hooks hooks`; every hook must attach as `kind`.
fn accounting_matches_kernel_schedstat_with(hooks: &str, kind: &str) {
    let cpu = (std::thread::available_parallelism().map_or(1, |n| n.get()) - 1).to_string();
    let mix = Workload::start(&["sched-mix", "--cpu", &cpu]);
    let _hog = Workload::start(&["hog", "--cpu", &cpu]);
    let pid = mix.pid();
    let (busy, sleeper) = (mix.tid("busy_tid"), mix.tid("sleeper_tid"));

    let mut probe = stallscope()
        .args([
            "--hooks",
            hooks,
            "probe",
            "--pid",
            &pid.to_string(),
            "--duration",
            "3s",
            "--json",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut at_open = None;
    let mut at_close = None;
    let mut attached = None;
    for line in BufReader::new(probe.stderr.take().unwrap()).lines() {
        let line = line.unwrap();
        if let Some(list) = line.split("kernel plane attached: ").nth(1) {
            attached = Some(list.to_string());
        }
        if line.starts_with("probe: window open") {
            at_open = Some([schedstat(pid, busy), schedstat(pid, sleeper)]);
        } else if line.starts_with("probe: window closed") {
            at_close = Some([schedstat(pid, busy), schedstat(pid, sleeper)]);
        }
    }
    let report = json_of(probe.wait_with_output().unwrap(), "stallscope probe");
    let (open, close) = (
        at_open.expect("window opened"),
        at_close.expect("window closed"),
    );
    let attached = attached.expect("the probe logs how its hooks attached");
    let hooks: Vec<&str> = attached.split_whitespace().collect();
    assert!(
        hooks.len() == 6 && hooks.iter().all(|h| h.ends_with(&format!(":{kind}"))),
        "every hook as {kind}: {attached}"
    );

    for (i, (name, tid)) in [("busy", busy), ("sleeper", sleeper)]
        .into_iter()
        .enumerate()
    {
        let t = thread(&report, tid);
        let kernel_cpu = close[i].0 - open[i].0;
        let kernel_runq = close[i].1 - open[i].1;
        eprintln!(
            "{name}: on-cpu ours {} kernel {kernel_cpu}; runq ours {} kernel {kernel_runq}",
            t["on_cpu_ns"], t["runq_wait_ns"]
        );
        assert_close(
            &format!("{name} on-CPU"),
            t["on_cpu_ns"].as_u64().unwrap(),
            kernel_cpu,
        );
        assert_close(
            &format!("{name} run-queue wait"),
            t["runq_wait_ns"].as_u64().unwrap(),
            kernel_runq,
        );
    }
    // The busy thread shares its CPU with the hog: it waits a lot and gets preempted.
    assert!(
        kernel_runq_share(&report, busy) > 0.2,
        "busy thread barely waited: {report}"
    );
    assert!(thread(&report, busy)["nivcsw"].as_u64().unwrap() > 10);
    // The sleeper blocks ~2 ms at a time, voluntarily.
    let s = thread(&report, sleeper);
    assert!(s["blocked_ns"].as_u64().unwrap() > 1_000_000_000, "{s}");
    assert!(s["nvcsw"].as_u64().unwrap() > 100, "{s}");
    assert!(
        s["syscalls"]["clock_nanosleep"]["count"].as_u64().unwrap() > 100,
        "{s}"
    );
}

fn kernel_runq_share(report: &Value, tid: u32) -> f64 {
    let t = thread(report, tid);
    t["runq_wait_ns"].as_f64().unwrap() / report["window_ns"].as_f64().unwrap()
}

/// `stallscope probe --pid W ARGS`, with a line written to `w`'s stdin once the probe's
/// window is open; its output, stderr included.
fn probe_with_go(w: &mut Workload, args: &[&str]) -> std::process::Output {
    let mut probe = stallscope()
        .args(["probe", "--pid", &w.pid().to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(probe.stderr.take().unwrap());
    let mut said = String::new();
    while !said.contains("probe: window open") {
        assert!(
            stderr.read_line(&mut said).unwrap() > 0,
            "the probe ended before its window opened:\n{said}"
        );
    }
    writeln!(w.proc.child().stdin.as_mut().unwrap(), "go").unwrap();
    stderr.read_to_string(&mut said).unwrap();
    let mut out = probe.wait_with_output().unwrap();
    out.stderr = said.into_bytes();
    out
}

/// `stallscope probe --json` for 1 s (and `extra`) on a one-thread syscall storm.
fn storm_report(extra: &[&str]) -> Value {
    let storm = Workload::start(&["syscall-storm", "--threads", "1"]);
    expect_json(
        stallscope()
            .args(["probe", "--pid", &storm.pid().to_string()])
            .args(["--duration", "1s", "--json"])
            .args(extra),
    )
}

/// The storm's thread in a report of it.
fn storm_thread(report: &Value) -> &Value {
    report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["comm"] == "storm0")
        .unwrap_or_else(|| panic!("no storm0 thread in {report}"))
}

/// Syscall counts, latency totals and send/recv bytes are attributed to the right thread.
/// The storm runs 1 s inside a 3 s window, so no call is in flight at either snapshot and
/// every count is exact.
#[test]
fn syscalls_and_network_bytes_are_counted() {
    require_root();
    let mut storm = Workload::start(&["syscall-storm", "--threads", "1", "--go-for", "1"]);
    let out = probe_with_go(&mut storm, &["--duration", "3s", "--json"]);
    let report = json_of(out, "stallscope probe");
    let storm_thread = storm_thread(&report);
    let sys = &storm_thread["syscalls"];
    let count = |name: &str| sys[name]["count"].as_u64().unwrap_or(0);
    let (getppid, sendto, recvfrom) = (count("getppid"), count("sendto"), count("recvfrom"));
    assert!(getppid > 10_000, "{sys}");
    // 64 getppid per sendto and recvfrom in the workload's loop.
    assert_eq!(getppid, 64 * sendto, "{sys}");
    assert_eq!(recvfrom, sendto, "{sys}");
    // The loop's sched_yield is a spin-wait's, left out outside deep dives.
    assert!(sys.get("sched_yield").is_none(), "{sys}");
    assert!(sys["getppid"]["total_ns"].as_u64().unwrap() > 0);
    let hist: u64 = sys["getppid"]["hist_log2_ns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(hist, getppid, "the histogram counts every call");
    // Each sendto sends 100 bytes and each recvfrom receives them.
    assert_eq!(storm_thread["net_tx_bytes"].as_u64().unwrap(), 100 * sendto);
    assert_eq!(
        storm_thread["net_rx_bytes"].as_u64().unwrap(),
        100 * recvfrom
    );
    assert_eq!(report["lost_events"], 0);
}

/// Deep-dive mode streams raw events, reports lost events, and accounts every syscall.
#[test]
fn deep_dive_streams_events() {
    require_root();
    let report = storm_report(&["--deep-dive"]);
    let ev = &report["deep_dive"]["events"];
    let (enter, exit, yield_runs) = (
        ev["sys_enter"].as_u64().unwrap(),
        ev["sys_exit"].as_u64().unwrap(),
        ev["yield_runs"].as_u64().unwrap(),
    );
    assert!(enter > 10_000, "{ev}");
    // A run of sched_yield ends with one YIELDS event instead of its calls' exits; here
    // every run is one call, a getppid after it.
    assert!(
        enter.abs_diff(exit + yield_runs) < 16,
        "every enter has its exit: {ev}"
    );
    assert!(report["lost_events"].is_u64());
    // A deep dive accounts every syscall, sched_yield too (one per 64 getppid).
    let storm_thread = storm_thread(&report);
    let sys = &storm_thread["syscalls"];
    let (getppid, yields) = (
        sys["getppid"]["count"].as_u64().unwrap(),
        sys["sched_yield"]["count"].as_u64().unwrap_or(0),
    );
    assert!(
        (getppid as f64 / yields.max(1) as f64 - 64.0).abs() < 2.0,
        "{sys}"
    );
    // Each call is a run of its own: runs are the same share of the streamed entries as
    // yields are of the accounted calls (the stream runs a little longer than the window).
    let accounted: u64 = ["getppid", "sched_yield", "sendto", "recvfrom"]
        .iter()
        .map(|n| sys[*n]["count"].as_u64().unwrap_or(0))
        .sum();
    let (streamed_share, accounted_share) = (
        yield_runs as f64 / enter as f64,
        yields as f64 / accounted as f64,
    );
    assert!(
        (streamed_share / accounted_share - 1.0).abs() < 0.05,
        "{sys} {ev}"
    );
}

/// The RLIMIT_MEMLOCK path: kernels before 5.11 charge BPF maps to it, so the loader lifts
/// its soft limit to the hard one (read from /proc while the probe runs under a 64 KiB soft
/// limit); with both at 0 nothing can be lifted, and this kernel (6.x, which charges the
/// memory cgroup instead) still loads every program.
#[test]
fn memlock_limit_is_lifted_and_not_needed_on_this_kernel() {
    require_root();
    let w = Workload::start(&["sched-mix", "--cpu", "0"]);
    // The hard limit as it is (raising it needs CAP_SYS_RESOURCE, which a sandbox may lack).
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer.
    assert_eq!(
        unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) },
        0
    );
    let hard = if lim.rlim_max == libc::RLIM_INFINITY {
        "unlimited".to_string()
    } else {
        lim.rlim_max.to_string()
    };
    for (limit, lifted) in [
        (format!("65536:{hard}"), hard.as_str()),
        ("0:0".to_string(), "0"),
    ] {
        let mut probe = Command::new("prlimit")
            .arg(format!("--memlock={limit}"))
            .arg("--")
            .arg(stallscope().get_program())
            .args([
                "probe",
                "--pid",
                &w.pid().to_string(),
                "--duration",
                "2s",
                "--json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut soft = None;
        for line in BufReader::new(probe.stderr.take().unwrap()).lines() {
            if line.unwrap().starts_with("probe: window open") {
                let limits =
                    std::fs::read_to_string(format!("/proc/{}/limits", probe.id())).unwrap();
                soft = limits
                    .lines()
                    .find(|l| l.starts_with("Max locked memory"))
                    .and_then(|l| l.split_whitespace().nth(3).map(str::to_string));
            }
        }
        let report = json_of(
            probe.wait_with_output().unwrap(),
            &format!("--memlock={limit}: the probe failed"),
        );
        assert!(
            report["threads"].as_array().is_some_and(|t| !t.is_empty()),
            "{report}"
        );
        assert_eq!(
            soft.as_deref(),
            Some(lifted),
            "--memlock={limit}: soft limit while loaded"
        );
    }
}

#[test]
fn no_such_pid_is_a_clear_error() {
    let err = expect_failure(stallscope().args(["probe", "--pid", "4000000", "--duration", "1s"]));
    assert!(err.contains("no such process: pid 4000000"), "{err}");
}

/// The target exits mid-window: a partial result for the part before, with a note.
#[test]
fn target_exit_during_probe_gives_partial_result() {
    require_root();
    let mut w = Workload::start(&["exit-after", "--ms", "1200"]);
    // The workload's 1.2 s start once the window is open, however long the probe's setup took.
    let out = probe_with_go(&mut w, &["--duration", "10s", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["target_exited"], true);
    let window = report["window_ns"].as_u64().unwrap();
    assert!(
        window < 5_000_000_000,
        "window should end with the process: {window}"
    );
    assert!(
        report["note"].as_str().unwrap().contains("exited"),
        "{report}"
    );
    let workers: Vec<&Value> = report["threads"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["comm"].as_str().unwrap().starts_with("worker"))
        .collect();
    assert_eq!(workers.len(), 3, "{report}");
    for t in workers {
        assert_eq!(t["exited"], true, "{t}");
        assert!(t["on_cpu_ns"].as_u64().unwrap() > 100_000_000, "{t}");
    }
    assert!(String::from_utf8_lossy(&out.stderr).contains("note: process"));
}

#[test]
fn no_privileges_is_a_clear_error() {
    require_root();
    let w = Workload::start(&["hog", "--cpu", "0"]);
    let err = expect_failure(stallscope_unprivileged().args([
        "probe",
        "--pid",
        &w.pid().to_string(),
        "--duration",
        "1s",
    ]));
    assert!(
        err.contains("missing privileges") && err.contains("CAP_BPF"),
        "{err}"
    );
}

#[test]
fn missing_btf_or_tracefs_is_a_clear_error() {
    require_root();
    let w = Workload::start(&["hog", "--cpu", "0"]);
    let pid = w.pid().to_string();
    let empty = std::env::temp_dir().join("stallscope-empty-tracefs");
    std::fs::create_dir_all(&empty).unwrap();

    let err = expect_failure(stallscope().args([
        "--btf",
        "/nonexistent/vmlinux",
        "probe",
        "--pid",
        &pid,
    ]));
    assert!(
        err.contains("missing kernel BTF: /nonexistent/vmlinux"),
        "{err}"
    );

    let err = expect_failure(
        stallscope()
            .arg("--tracefs")
            .arg(&empty)
            .args(["probe", "--pid", &pid]),
    );
    assert!(
        err.contains("tracefs is not mounted at") && err.contains("mount -t tracefs"),
        "{err}"
    );
}

/// `stallscope run` starts on its embedded default, says what it watches, and stops
/// cleanly on SIGTERM.
#[test]
fn daemon_starts_and_stops_on_sigterm() {
    require_root();
    let w = Workload::start(&["hog", "--cpu", "0"]);
    let mut daemon = stallscope()
        .args(["run", "--pid", &w.pid().to_string()])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(daemon.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    for line in lines.by_ref() {
        let line = line.unwrap();
        seen.push(line.clone());
        if line.contains(&format!("watching pid {}", w.pid())) {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    seen.extend(lines.map(|l| l.unwrap()));
    let status = daemon.wait().unwrap();
    let log = seen.join("\n");
    assert!(status.success(), "{log}");
    assert!(
        log.contains("SIGTERM: stopping") && log.contains("stallscope stopped"),
        "{log}"
    );
}
