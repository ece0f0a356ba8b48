//! Helpers shared by the end-to-end test files.
// Each test file uses a subset of these helpers.
#![allow(dead_code)]

use std::{
    io::{BufRead, BufReader},
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, ChildStdout, Command, Stdio},
    time::Duration,
};

use sys_util::process::Group;

pub mod daemon;
pub mod kubelet;
pub mod netns;
pub mod otlp_receiver;
pub mod proc_events;
pub mod servers;
pub mod vllm;

/// The stallscope binary (`cargo xtask test` builds it and sets STALLSCOPE_BIN).
pub fn stallscope() -> Command {
    let bin = std::env::var_os("STALLSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/stallscope")
        });
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask test`",
        bin.display()
    );
    let mut c = Command::new(bin);
    c.env("RUST_LOG", "info");
    c
}

/// Fails the test unless it runs as root (eBPF and ptrace of any process need it).
pub fn require_root() {
    // SAFETY: no arguments.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests load eBPF programs and ptrace targets: run them as root"
    );
}

/// Runs `cmd`, asserts it failed, returns its stderr.
pub fn expect_failure(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{cmd:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The capabilities stallscope needs without root (README, Requirements), as setpriv names
/// them.
pub const CAPABILITIES: [&str; 5] = ["bpf", "perfmon", "sys_ptrace", "chown", "dac_read_search"];

/// `stallscope` run as nobody with only `caps` (setpriv's names), inheritable and ambient so
/// that they survive the change of user.
pub fn stallscope_with_caps(caps: &[&str]) -> Command {
    let list: Vec<String> = caps.iter().map(|c| format!("+{c}")).collect();
    let list = list.join(",");
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps=-all,{list}"))
        .arg(format!("--ambient-caps=-all,{list}"))
        .arg(stallscope().get_program());
    c
}

/// `stallscope` run as nobody with no capabilities at all (setpriv), for the missing-privilege errors.
pub fn stallscope_unprivileged() -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
    .arg(stallscope().get_program());
    c
}

/// The pyenv interpreter for `major.minor` (PYENV_ROOT or ~/.pyenv).
pub fn python(version: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".pyenv"));
    let dir = std::fs::read_dir(root.join("versions"))
        .expect("pyenv versions (cargo xtask setup checks them)")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("{version}.")) && !name[version.len() + 1..].contains('.')
        })
        .unwrap_or_else(|| panic!("CPython {version} is not installed in pyenv"));
    dir.join("bin/python3")
}

/// A free loopback port.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// One HTTP/1.0 request on loopback; returns the status code and the body. Waits up to 60 s
/// for the answer (the daemon's HTTP thread shares 2 CPUs with a hog and the engine).
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
) -> (u16, String) {
    let r = sys_util::http::request(port, method, path, headers, body, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{method} {path}: no answer within 60 s: {e}"));
    (r.status, r.body)
}

/// One HTTP GET on loopback; returns the body (panics on a non-200).
pub fn http_get(port: u16, path: &str) -> String {
    let (code, body) = http_request(port, "GET", path, "", "");
    assert_eq!(code, 200, "GET {path}: {body}");
    body
}

/// The files of stallscope's that `pid` maps (its probe ring, GPU channel or agent), by name,
/// leaving out the probe's compiled writer: CPython cannot unload an extension module, so once
/// loaded it stays, and at most one copy of it may be mapped (a later attach reuses it).
pub fn stallscope_mappings(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    // The path is the sixth field; the tests' own directories are named after stallscope too,
    // so only file names count.
    let names: std::collections::BTreeSet<&str> = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .filter_map(|path| path.rsplit('/').next())
        .filter(|name| name.starts_with("stallscope") || name.starts_with("libstallscope"))
        .collect();
    let writers = names
        .iter()
        .filter(|n| n.starts_with(pyframe_tracer::native::COPY_PREFIX))
        .count();
    assert!(
        writers <= 1,
        "process {pid} maps {writers} copies of the compiled writer: {names:?}"
    );
    names
        .into_iter()
        .filter(|n| !n.starts_with(pyframe_tracer::native::COPY_PREFIX))
        .map(str::to_string)
        .collect()
}

/// Each thread of `pid` by id, with its scheduling policy and nice value (`/proc/PID/task/TID/stat`
/// fields 41 and 19): what a remote call raises for its hold and must put back.
pub fn thread_scheduling(pid: u32) -> std::collections::BTreeMap<String, (String, String)> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).ok()?;
                    let fields = sys_util::task_state::stat_fields(&stat);
                    let (nice, policy) = (fields.get(16)?, fields.get(38)?);
                    let tid = t.file_name().to_string_lossy().into_owned();
                    Some((tid, (policy.to_string(), nice.to_string())))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The threads of `before` (a [`thread_scheduling`]) still in `pid` whose policy or nice value
/// changed since.
pub fn scheduling_changed(
    pid: u32,
    before: &std::collections::BTreeMap<String, (String, String)>,
) -> Vec<String> {
    thread_scheduling(pid)
        .into_iter()
        .filter_map(|(tid, now)| {
            let was = before.get(&tid)?;
            (*was != now).then(|| format!("thread {tid}: (policy, nice) {was:?} -> {now:?}"))
        })
        .collect()
}

/// The stand-in libcupti `cargo xtask setup` builds (STALLSCOPE_CUPTI_STANDIN overrides).
pub fn standin_library() -> PathBuf {
    let built = std::env::var_os("STALLSCOPE_CUPTI_STANDIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/libcupti_standin.so")
        });
    assert!(
        built.exists(),
        "{} is missing: run `cargo xtask test`",
        built.display()
    );
    built
}

/// The cache outside the checkout that `cargo xtask setup` fills (`STALLSCOPE_CACHE`, else
/// `~/.cache/stallscope`), as xtask's `setup::cache_dir` finds it.
pub fn cache_dir() -> PathBuf {
    std::env::var_os("STALLSCOPE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/stallscope")
        })
}

/// The interpreter of the venv `cargo xtask setup` builds at `<cache>/<venv>`.
pub fn tool_python(venv: &str) -> PathBuf {
    let py = cache_dir().join(venv).join("bin/python");
    assert!(
        py.exists(),
        "{} is missing: run cargo xtask setup",
        py.display()
    );
    py
}

/// The interpreter of the venv with PyPI `perfetto`.
pub fn perfetto_python() -> PathBuf {
    tool_python("perfetto-venv")
}

/// Checks a trace with PyPI perfetto's perfetto_trace_pb2; returns its summary.
pub fn python_check(trace: &std::path::Path) -> serde_json::Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/check_perfetto.py");
    let out = Command::new(perfetto_python())
        .arg(script)
        .arg(trace)
        .output()
        .unwrap();
    json_of(out, "perfetto_trace_pb2 rejects the trace")
}

/// When the capture of deep dive `dive` began, ns since the epoch, by its trace's own clocks:
/// the "deep dive" window's start (CLOCK_MONOTONIC) plus the trace's clock snapshot's
/// REALTIME − MONOTONIC.
pub fn capture_start_unix_ns(dive: &serde_json::Value) -> i128 {
    let trace = std::fs::read(dive["trace"].as_str().unwrap()).unwrap();
    let decoded =
        perfetto_writer::read::decode(&trace).unwrap_or_else(|e| panic!("invalid trace:\n{e}"));
    let clock = |id: u32| {
        decoded
            .clocks
            .iter()
            .find(|(c, _)| *c == id)
            .map(|&(_, ns)| i128::from(ns))
            .unwrap_or_else(|| panic!("no clock {id} in the snapshot: {:?}", decoded.clocks))
    };
    // Perfetto's builtin clock ids: REALTIME 1, MONOTONIC 3.
    let offset = clock(1) - clock(3);
    let window = decoded
        .slices
        .iter()
        .find(|s| s.name == "deep dive")
        .expect("the trace's deep-dive window");
    i128::from(window.start) + offset
}

/// Runs `cmd`, asserts it succeeded (showing its stderr if not), returns its stdout.
pub fn expect_success(cmd: &mut Command) -> Vec<u8> {
    let out = cmd.output().unwrap();
    assert_succeeded(&out, &format!("{cmd:?}"));
    out.stdout
}

/// Asserts that a finished run succeeded, showing its stderr if not (`what` names it).
pub fn assert_succeeded(out: &std::process::Output, what: &str) {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cmd` (a stallscope command with `--json`), asserts it succeeds, and parses the one
/// JSON document it prints.
pub fn expect_json(cmd: &mut Command) -> serde_json::Value {
    json_of(cmd.output().unwrap(), &format!("{cmd:?}"))
}

/// The one JSON document a finished run printed, asserting it succeeded (`what` names the run
/// in the failure, with its stderr).
pub fn json_of(out: std::process::Output, what: &str) -> serde_json::Value {
    assert_succeeded(&out, what);
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{what} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The last `lines` lines of `text`.
pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The one spawned-process fixture: a child leading its own process group, killed with the
/// whole group when dropped (children it started, such as the load generator's Python,
/// included). Panics when the command cannot start.
pub struct Proc(Group);

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        Proc(Group::spawn(cmd).unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}")))
    }

    /// Spawns `cmd` with its stdout piped and waits for its first line, which must start
    /// with `ready` (the target is set up); that line, and the rest of its stdout.
    pub fn spawn_ready(cmd: &mut Command, ready: &str) -> (Proc, String, BufReader<ChildStdout>) {
        let mut p = Proc::spawn(cmd.stdout(Stdio::piped()));
        let mut out = BufReader::new(p.child().stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        assert!(
            first.starts_with(ready),
            "{cmd:?} said {first:?}, not {ready:?}"
        );
        (p, first, out)
    }

    pub fn id(&self) -> u32 {
        self.0.id()
    }

    pub fn child(&mut self) -> &mut Child {
        self.0.child()
    }
}

/// A fresh scratch directory for one test.
pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("stallscope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The hog for the toy engine, whose steps take about 5 ms: it takes eight ninths of CPU 0, so
/// the toy's steps run several times slower than the baseline predicts. The sentinel's error
/// is `1 - predicted / actual` and its UCL at most 0.5, so an alert needs steps more than
/// twice their prediction, including on a noisy host whose training set already holds slow
/// steps (there the fitted UCL sits at its 0.5 cap and the prediction runs high: a hog taking
/// two thirds can stretch the steps too little to cross it).
pub const TOY_HOG: Hog = Hog {
    spin: Duration::from_millis(2),
    sleep: Duration::from_micros(250),
};

/// The toy engine, pinned to CPU 0.
pub fn start_engine() -> Proc {
    start_toy(None, None)
}

/// The toy engine, pinned to `cpus`, run by the programs of `prefix` (e.g. to enter a
/// network namespace), each of which execs the next.
pub fn start_engine_in(prefix: &[String], cpus: &str) -> Proc {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_engine.py");
    let mut cmd = Command::new(&prefix[0]);
    cmd.args(&prefix[1..])
        .args(["taskset", "-c", cpus])
        .arg(python("3.12"))
        .arg(script);
    Proc::spawn_ready(&mut cmd, "ready ").0
}

/// The toy engine, pinned to CPU 0, timing its own steps into `times` (see
/// [`toy_slowdown`]).
pub fn start_timed_engine(times: &Path) -> Proc {
    start_toy(Some(times), None)
}

/// The toy engine (timing its steps into `times` if given) with `tag` as an argument on its
/// command line, which the toy ignores: for a daemon that finds its engine by pattern, which
/// must not match the toys of the other tests running beside it (every toy's command line
/// holds `py_engine.py`).
pub fn start_engine_tagged(times: Option<&Path>, tag: &str) -> Proc {
    start_toy(times, Some(tag))
}

fn start_toy(times: Option<&Path>, tag: Option<&str>) -> Proc {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_engine.py");
    let mut cmd = Command::new("taskset");
    cmd.args(["-c", "0"]).arg(python("3.12")).arg(script);
    cmd.args(tag);
    if let Some(t) = times {
        cmd.env("STALLSCOPE_TOY_TIMES", t);
    }
    Proc::spawn_ready(&mut cmd, "ready ").0
}

/// The steps the toy engine timed into `times` that ended in `from_ns..to_ns`
/// (CLOCK_MONOTONIC): its own count of its pace. The toy flushes its file every 50 steps, so
/// read it a second after `to_ns`.
pub fn toy_steps_between(times: &Path, from_ns: u64, to_ns: u64) -> usize {
    toy_step_walls_ms(times, from_ns, to_ns).len()
}

/// The wall time (ms) of each of those steps.
pub fn toy_step_walls_ms(times: &Path, from_ns: u64, to_ns: u64) -> Vec<f64> {
    std::fs::read_to_string(times)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let mut f = l.split(' ');
            let end: u64 = f.next()?.parse().ok()?;
            let wall: f64 = f.next()?.parse().ok()?;
            (from_ns..to_ns).contains(&end).then_some(wall / 1e6)
        })
        .collect()
}

/// The median of the values of each key seen at least `min_count` times: an engine's usual
/// step time per workload, against which its own clock shows a slowdown.
pub fn medians_by<K: Ord>(
    pairs: impl IntoIterator<Item = (K, f64)>,
    min_count: usize,
) -> std::collections::BTreeMap<K, f64> {
    let mut by_key: std::collections::BTreeMap<K, Vec<f64>> = Default::default();
    for (k, v) in pairs {
        by_key.entry(k).or_default().push(v);
    }
    by_key
        .into_iter()
        .filter(|(_, v)| v.len() >= min_count)
        .map(|(k, mut v)| {
            v.sort_by(f64::total_cmp);
            (k, v[v.len() / 2])
        })
        .collect()
}

/// How much slower than usual the toy engine's own clock saw its `steps` steps that ended by
/// `end_ns` (CLOCK_MONOTONIC, as the probes' timestamps): their wall time over the median wall
/// time of steps with the same work, among all it timed (its workloads repeat every 256
/// steps). Evidence of a slowdown that comes neither from stallscope's measurement nor from
/// its model.
pub fn toy_slowdown(times: &Path, end_ns: u64, steps: usize) -> f64 {
    // The toy writes its file every 50 steps: wait until it has timed a step past `end_ns`.
    let t = std::time::Instant::now();
    while toy_steps_between(times, end_ns + 1_000_000, u64::MAX) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "the toy timed no step after {end_ns} ns within 20 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = std::fs::read_to_string(times).unwrap();
    // end ns, wall ns, work units
    let rows: Vec<(u64, f64, u64)> = text
        .lines()
        .filter_map(|l| {
            let mut v = l.split(' ');
            Some((
                v.next()?.parse().ok()?,
                v.next()?.parse().ok()?,
                v.next()?.parse().ok()?,
            ))
        })
        .collect();
    let usual = medians_by(rows.iter().map(|&(_, wall, work)| (work, wall)), 1);
    // The toy stamps a step's end after the probe does.
    let upto = rows.partition_point(|r| r.0 <= end_ns + 1_000_000);
    let chosen = &rows[upto.saturating_sub(steps)..upto];
    let wall: f64 = chosen.iter().map(|r| r.1).sum();
    let expected: f64 = chosen.iter().map(|r| usual[&r.2]).sum();
    wall / expected
}

/// A CPU hog's duty cycle: it spins for `spin`, then sleeps for `sleep`, taking
/// `spin / (spin + sleep)` of each CPU it runs on. Pick `spin` near the engine's step time so
/// that every step is stretched: the sentinel's error is bounded below 1 per step, so a hog
/// that stretches one step in many moves the moving mean little.
#[derive(Debug, Clone, Copy)]
pub struct Hog {
    pub spin: Duration,
    pub sleep: Duration,
}

impl Hog {
    /// Two thirds of each CPU: spins for `spin`, sleeps half as long.
    pub fn two_thirds(spin: Duration) -> Hog {
        Hog {
            spin,
            sleep: spin / 2,
        }
    }
}

/// A CPU hog on `cpus` running `hog`'s duty cycle.
///
/// SCHED_FIFO priority 1: on this kind of host (kernel 6.18, EEVDF, autogroup) an ordinary
/// busy loop hardly slows a thread that sleeps between its steps: the woken thread runs its
/// step at full speed and only starts it later (measured on the toy engine: median step
/// unchanged under two busy loops), and a busy loop pinned to vLLM's worker CPU got no CPU
/// time at all. `timeout` bounds its life.
pub fn start_hog(cpus: &str, hog: Hog) -> Proc {
    let script = format!(
        "import time\nwhile True:\n    t = time.monotonic() + {spin}\n    while time.monotonic() < t: pass\n    time.sleep({sleep})\n",
        spin = hog.spin.as_secs_f64(),
        sleep = hog.sleep.as_secs_f64()
    );
    Proc::spawn(
        Command::new("timeout")
            .args([
                "120", "chrt", "-f", "1", "taskset", "-c", cpus, "python3", "-c",
            ])
            .arg(script),
    )
}

/// This thread's CPUs.
pub fn this_thread_affinity() -> std::collections::BTreeSet<usize> {
    sys_util::sched::affinity(0).unwrap_or_else(|e| panic!("sched_getaffinity: {e}"))
}

/// Sets this thread's CPUs (children inherit them).
pub fn set_this_thread_affinity(cpus: &std::collections::BTreeSet<usize>) {
    sys_util::sched::set_affinity(0, cpus).unwrap_or_else(|e| panic!("sched_setaffinity: {e}"));
}

/// Pins this thread to `cpu` (children inherit it).
pub fn pin_this_thread_to_cpu(cpu: usize) {
    set_this_thread_affinity(&std::collections::BTreeSet::from([cpu]));
}
