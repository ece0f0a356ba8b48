//! The GPU plane against a live Python process whose CUDA is the stand-in libcupti.so.13
//! (CI has no GPU; `cargo xtask gpu-check` is the real-GPU counterpart): the agent is loaded
//! at a safe point, CUPTI records come through the channel joined to their launching calls,
//! CUPTI's clock lands on CLOCK_MONOTONIC within the target's own stamps, and detaching gives
//! CUPTI back and unloads the agent, whether it shares CUPTI with another tool (CUPTI >= 13.3)
//! or holds it alone (older CUPTI, or a driver that cannot share). Plus the clear failures: a
//! subscriber slot held by a tool that does not share, no
//! libcupti, not a Python process. A deep dive of such a process carries its GPU tracks, and
//! the daemon's sentinel reports each iteration's GPU busy time and void share.

use std::{
    collections::HashMap,
    io::BufRead,
    path::{Path, PathBuf},
    process::Command,
    sync::{Arc, Mutex},
    time::Duration,
};

mod common;
use common::{
    expect_failure, free_port, http_get, json_of, python, python_check, require_root, stallscope,
    tmpdir, Proc,
};

/// The stand-in, copied under CUPTI 13's file name.
fn standin(dir: &Path) -> PathBuf {
    let built = common::standin_library();
    let lib = dir.join("libcupti.so.13");
    std::fs::copy(&built, &lib).unwrap();
    lib
}

/// The GPU loop and what it prints.
struct Target {
    proc: Proc,
    launches: Arc<Mutex<HashMap<u32, (u64, u64)>>>,
    states: Arc<Mutex<Vec<u64>>>,
}

impl Target {
    /// Starts the loop; `hold` is gpu_loop.py's "held" or "shared" (another tool's hold on
    /// CUPTI), and `env` sets the stand-in's variables.
    fn start(name: &str, hold: Option<&str>, env: &[(&str, &str)]) -> Target {
        let dir = tmpdir(name);
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/gpu_loop.py");
        let mut cmd = Command::new(python("3.12"));
        cmd.arg(script)
            .arg(standin(&dir))
            .args(hold)
            .envs(env.iter().copied());
        let (proc, _, out) = Proc::spawn_ready(&mut cmd, "ready");
        let launches = Arc::new(Mutex::new(HashMap::new()));
        let states = Arc::new(Mutex::new(Vec::new()));
        let (l, s) = (launches.clone(), states.clone());
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                let f: Vec<&str> = line.split_whitespace().collect();
                match f[..] {
                    ["launch", c, t0, t1] => match (c.parse(), t0.parse(), t1.parse()) {
                        (Ok(c), Ok(t0), Ok(t1)) => {
                            l.lock().unwrap().insert(c, (t0, t1));
                        }
                        _ => eprintln!("gpu_loop printed {line:?}"),
                    },
                    ["state", v] => s.lock().unwrap().push(v.parse().unwrap()),
                    _ => eprintln!("gpu_loop printed {line:?}"),
                }
            }
        });
        Target {
            proc,
            launches,
            states,
        }
    }

    fn pid(&self) -> u32 {
        self.proc.id()
    }

    /// The CUPTI state the target reports after `wait`.
    fn state_after(&self, wait: Duration) -> u64 {
        let n = self.states.lock().unwrap().len();
        std::thread::sleep(wait);
        let s = self.states.lock().unwrap();
        assert!(s.len() > n, "the target stopped stepping");
        *s.last().unwrap()
    }

    fn maps(&self) -> String {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid())).unwrap()
    }
}

/// stallscope with the stand-in playing the NVIDIA driver.
fn stallscope_standin() -> Command {
    let mut c = stallscope();
    c.env("STALLSCOPE_GPU_STANDIN", "1");
    c
}

/// `stallscope gpu` on `pid` for 2 s with `extra` arguments: its JSON report (the run, said
/// as `what`, must succeed).
fn gpu(pid: u32, extra: &[&str], what: &str) -> serde_json::Value {
    let out = stallscope_standin()
        .args([
            "gpu",
            "--pid",
            &pid.to_string(),
            "--duration",
            "2s",
            "--json",
        ])
        .args(extra)
        .output()
        .unwrap();
    json_of(out, what)
}

fn nothing_left(t: &Target) {
    let pid = t.pid();
    assert!(
        !t.maps().contains("stallscope-gpu-agent"),
        "the agent is still mapped"
    );
    assert!(!Path::new(&format!("/dev/shm/stallscope-gpu-{pid}")).exists());
    assert!(!Path::new(&format!("/tmp/stallscope-gpu-agent-{pid}.so")).exists());
}

#[test]
fn traces_a_live_process_and_gives_everything_back() {
    require_root();
    let t = Target::start("gpu-trace", None, &[]);
    assert_eq!(
        t.state_after(Duration::from_millis(200)),
        0,
        "CUPTI idle before attach"
    );
    let dir = tmpdir("gpu-trace-out");
    let trace = dir.join("gpu.pftrace");
    let r = gpu(t.pid(), &["-o", trace.to_str().unwrap()], "first attach");
    let s = &r["summary"];
    // ~2 s of 2.4 ms steps: hundreds of each.
    assert!(s["kernels"].as_u64().unwrap() > 200, "{r}");
    assert!(s["memcpys"].as_u64().unwrap() > 100, "{r}");
    assert!(s["synchronizations"].as_u64().unwrap() > 100, "{r}");
    assert_eq!(s["correlated_pct"], 100.0, "{r}");
    let latency = s["launch_to_start_us"]["p50"].as_f64().unwrap();
    assert!(
        (4.0..1000.0).contains(&latency),
        "launch to start {latency} µs: {r}"
    );
    assert_eq!(
        s["top_kernels"][0]["name"], "ampere_bf16_gemm_128x128",
        "{r}"
    );
    assert!(r["clock"]["samples"].as_u64().unwrap() >= 2, "{r}");
    assert_eq!(r["lost_events"], 0);
    assert_eq!(r["cupti_version"], 130500);
    assert_eq!(r["subscription"], "shared (multi-subscriber)", "{r}");
    assert_eq!(r["agent_unloaded"], true, "{r}");
    // The agent built for old glibc is the one loaded (see old_glibc_agent_...).
    assert!(
        r["agent"]
            .as_str()
            .unwrap()
            .ends_with("glibc-2.28/libstallscope_cupti_agent.so"),
        "{r}"
    );

    // Detached: CUPTI holds nothing (no subscriber, callbacks or kinds), nothing is left in
    // the process, and it keeps stepping.
    assert_eq!(t.state_after(Duration::from_millis(300)), 0);
    nothing_left(&t);

    // The trace: kernels on the stream track, each the end of a flow from its launch call on
    // the target's main thread, whose time lies within the target's own stamps of the call.
    let d = perfetto_writer::read::decode(&std::fs::read(&trace).unwrap()).unwrap();
    let (kernels, pairs) = kernel_calls(&d, t.pid());
    assert!(kernels > 200);
    assert_eq!(pairs.len(), kernels, "every kernel's flow starts at a call");
    assert_eq!(queries(&d), 0, "cudaGetDevice records were kept");
    let launches = t.launches.lock().unwrap();
    let mut worst_ns = 0u64;
    for (k, call) in &pairs {
        assert_eq!(call.name, "cudaLaunchKernel");
        assert!(
            k.start >= call.start,
            "{k:?} starts before its launch {call:?}"
        );
        let corr = correlation_id(k);
        let (t0, t1) = launches[&corr];
        let outside = t0
            .saturating_sub(call.start)
            .max(call.end.saturating_sub(t1));
        worst_ns = worst_ns.max(outside);
    }
    eprintln!("{kernels} kernels; their launch calls lie at most {worst_ns} ns outside the target's stamps");
    // The target's stamps bracket the call within microseconds; allow 100 µs.
    assert!(
        worst_ns < 100_000,
        "a call lies {worst_ns} ns outside the target's own stamps"
    );
    // (The target blocks on its stdout while the reader waits for this lock.)
    drop(launches);

    // A second attach works the same way.
    gpu(t.pid(), &[], "second attach");
    nothing_left(&t);
}

#[test]
fn sampled_tracing_records_every_launch_inside_its_spans_and_none_far_outside() {
    require_root();
    let t = Target::start("gpu-sampled", None, &[]);
    let dir = tmpdir("gpu-sampled-out");
    let trace = dir.join("gpu.pftrace");
    let r = gpu(
        t.pid(),
        &["--sample", "200ms/600ms", "-o", trace.to_str().unwrap()],
        "sampled",
    );
    assert_eq!(r["sampling"], "200ms/600ms", "{r}");
    let spans: Vec<(u64, u64)> = serde_json::from_value(r["traced_ns"].clone()).unwrap();
    let [from, to]: [u64; 2] = serde_json::from_value(r["window_ns"].clone()).unwrap();
    // A 2 s window holds three or four 200 ms spans (the first may be cut by the window).
    assert!((3..=5).contains(&spans.len()), "spans {spans:?}: {r}");
    let traced: u64 = spans.iter().map(|(a, b)| b - a).sum();
    assert!(
        traced * 2 < to - from,
        "{traced} ns of {} traced",
        to - from
    );
    for (a, b) in &spans {
        assert!(b - a <= 260_000_000, "a span of {} ms", (b - a) / 1_000_000);
    }
    // The switch's own stamps are taken inside it: a launch up to 50 ms outside a span may
    // still be recorded, none further.
    const SLACK: u64 = 50_000_000;
    let d = perfetto_writer::read::decode(&std::fs::read(&trace).unwrap()).unwrap();
    let (kernels, pairs) = kernel_calls(&d, t.pid());
    assert_eq!(pairs.len(), kernels, "every kernel's flow starts at a call");
    let launches = t.launches.lock().unwrap();
    let recorded: std::collections::HashSet<u32> =
        pairs.iter().map(|(k, _)| correlation_id(k)).collect();
    let mut inside = 0;
    for (corr, &(t0, t1)) in launches.iter() {
        if t0 < from || t1 > to {
            continue;
        }
        if spans.iter().any(|&(a, b)| a <= t0 && t1 <= b) {
            inside += 1;
            assert!(
                recorded.contains(corr),
                "launch {corr} inside a span was not recorded"
            );
        } else if recorded.contains(corr) {
            assert!(
                spans
                    .iter()
                    .any(|&(a, b)| a.saturating_sub(SLACK) <= t0 && t1 <= b + SLACK),
                "launch {corr} at {t0} was recorded far outside every span {spans:?}"
            );
        }
    }
    assert!(inside > 100, "{inside} launches inside the spans");
    drop(launches);
    nothing_left(&t);
}

type Slice = perfetto_writer::read::Slice;

/// The kernel slices on the stream track, and each (kernel, call) pair where the kernel ends a
/// flow that starts at a call on the CUDA API track of thread `tid`.
fn kernel_calls(d: &perfetto_writer::read::Decoded, tid: u32) -> (usize, Vec<(&Slice, &Slice)>) {
    let stream = d
        .tracks_named("GPU 0 stream 7")
        .next()
        .expect("a stream track")
        .uuid;
    let api: Vec<u64> = d
        .tracks_named("CUDA API")
        .filter(|t| d.thread_of(t.uuid) == Some(tid))
        .map(|t| t.uuid)
        .collect();
    assert_eq!(api.len(), 1, "one CUDA API track under thread {tid}");
    let calls: HashMap<u64, &Slice> = d
        .slices
        .iter()
        .filter(|s| s.track == api[0])
        .flat_map(|s| s.flows.iter().map(move |f| (*f, s)))
        .collect();
    let kernels: Vec<&Slice> = d
        .slices
        .iter()
        .filter(|s| s.track == stream && !s.name.starts_with("HtoD"))
        .collect();
    let pairs = kernels
        .iter()
        .filter_map(|k| k.flows.iter().find_map(|f| calls.get(f)).map(|c| (*k, *c)))
        .collect();
    (kernels.len(), pairs)
}

/// API slices of `cudaGetDevice`, which the stand-in records before each launch unless told
/// not to (the agent turns such queries off).
/// A kernel slice's CUPTI correlation id (the target's own key for its launches).
fn correlation_id(kernel: &Slice) -> u32 {
    match kernel.args["correlation_id"] {
        perfetto_writer::read::ArgValue::Int(c) => c as u32,
        ref other => panic!("correlation_id {other:?} in {kernel:?}"),
    }
}

fn queries(d: &perfetto_writer::read::Decoded) -> usize {
    d.slices
        .iter()
        .filter(|s| s.name == "cudaGetDevice" || s.name == "cuda runtime #17")
        .count()
}

#[test]
fn deep_dives_carry_the_gpu_tracks() {
    require_root();
    let t = Target::start("gpu-dive", None, &[]);
    let dir = tmpdir("gpu-dive-out");
    let trace = dir.join("dive.pftrace");
    let out = stallscope_standin()
        .args([
            "deep-dive",
            "--pid",
            &t.pid().to_string(),
            "--duration",
            "2s",
            "-o",
        ])
        .arg(&trace)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let d = perfetto_writer::read::decode(&std::fs::read(&trace).unwrap()).unwrap();
    let (kernels, pairs) = kernel_calls(&d, t.pid());
    assert!(kernels > 200, "{kernels} kernels in a 2 s deep dive");
    assert_eq!(pairs.len(), kernels, "a kernel without its launch call");
    // PyPI perfetto's own protobuf classes read it too.
    python_check(&trace);
    assert_eq!(t.state_after(Duration::from_millis(300)), 0);
    nothing_left(&t);
}

#[test]
fn the_sentinel_measures_gpu_time_per_iteration() {
    require_root();
    let t = Target::start("gpu-sentinel", None, &[]);
    let dir = tmpdir("gpu-sentinel-state");
    let port = free_port();
    let cfg = dir.join("config.toml");
    // The embedded default, pointed at the loop (its `step` is the only watched function).
    let mut text = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../probe-user/config/default.toml"),
    )
    .unwrap();
    for (from, to) in [
        ("pids = []".to_string(), format!("pids = [{}]", t.pid())),
        (
            "process_patterns = [\"VLLM::EngineCore\", \"VLLM::Worker\", \"sglang::scheduler\"]"
                .into(),
            "process_patterns = []".into(),
        ),
        (
            "engine_patterns = [\"VLLM::EngineCore\", \"sglang::scheduler\"]".into(),
            "engine_patterns = []".into(),
        ),
        (
            "framework = \"auto\"".into(),
            "framework = \"generic\"".into(),
        ),
        ("watch = []".into(), "watch = [\"__main__:step\"]".into()),
        ("on_alert = true".into(), "on_alert = false".into()),
        (
            "reference_every = \"10m\"".into(),
            "reference_every = \"1000h\"".into(),
        ),
        (
            "listen = \"127.0.0.1:9464\"".into(),
            format!("listen = \"127.0.0.1:{port}\""),
        ),
        (
            "dir = \"/var/lib/stallscope\"".into(),
            format!("dir = \"{}\"", dir.display()),
        ),
    ] {
        assert!(
            text.contains(&from),
            "the default configuration has no `{from}`"
        );
        text = text.replace(&from, &to);
    }
    std::fs::write(&cfg, text).unwrap();
    let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
    let mut daemon = Proc::spawn(
        stallscope_standin()
            .args(["run", "--config"])
            .arg(&cfg)
            .stderr(log),
    );
    // The anchor is discovered over 10 s; GPU figures follow each iteration by 0.6 s.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let engine = loop {
        let status: serde_json::Value = std::net::TcpStream::connect(("127.0.0.1", port))
            .ok()
            .map(|_| serde_json::from_str(&http_get(port, "/api/v1/status")).unwrap())
            .unwrap_or_default();
        let e = status["engines"][0].clone();
        if e["gpu_iterations"].as_u64().unwrap_or(0) >= 200 {
            break e;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no GPU figures after 60 s: {e}\n{}",
            std::fs::read_to_string(dir.join("daemon.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let plane = engine["gpu_plane"].as_str().unwrap();
    assert!(
        plane.starts_with("on: ") && plane.ends_with("tracing 1s/10s"),
        "{engine}"
    );
    // The default samples a tenth of the time: only iterations inside a traced second have
    // GPU figures.
    let decode = engine["iterations"]["decode"].as_u64().unwrap();
    let with_gpu = engine["gpu_iterations"].as_u64().unwrap();
    assert!(
        with_gpu * 2 < decode,
        "{with_gpu} of {decode} iterations have GPU figures under 1s/10s sampling: {engine}"
    );
    // Each step launches 460 µs of GPU work and waits for it: the GPU is busy for most of it.
    let void = engine["gpu_void_ratio"].as_f64().unwrap();
    assert!((0.0..0.9).contains(&void), "void share {void}: {engine}");
    let metrics = http_get(port, "/metrics");
    for name in [
        "stallscope_iteration_gpu_busy_seconds_count",
        "stallscope_iteration_gpu_void_ratio_count",
        "stallscope_gpu_launch_latency_seconds_count",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
    // SIGTERM: the daemon detaches the agent too.
    // SAFETY: kill(2) on our child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let status = daemon.child().wait().unwrap();
    assert!(status.success(), "daemon exit {status:?}");
    assert_eq!(t.state_after(Duration::from_millis(300)), 0);
    nothing_left(&t);
}

/// Bit 4 of the stand-in's state: another tool holds CUPTI.
const OTHER_TOOL: u64 = 1 << 4;

#[test]
fn a_held_subscriber_slot_is_reported_not_fought() {
    require_root();
    let t = Target::start("gpu-held", Some("held"), &[]);
    let e = expect_failure(stallscope_standin().args([
        "gpu",
        "--pid",
        &t.pid().to_string(),
        "--duration",
        "1s",
    ]));
    assert!(
        e.contains("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED"),
        "{e}"
    );
    // CUPTI >= 13.3 names the holder.
    assert!(e.contains("\"torch.profiler (Kineto)\" holds"), "{e}");
    let last = e.trim().lines().last().unwrap_or_default();
    assert!(last.starts_with("error: no GPU plane for process"), "{e}");
    // Nothing of ours in CUPTI; the other tool still holds it.
    assert_eq!(t.state_after(Duration::from_millis(200)), OTHER_TOOL);
    nothing_left(&t);
}

#[test]
fn a_slot_shared_by_another_tool_is_shared_and_left_to_it() {
    require_root();
    let t = Target::start("gpu-shared", Some("shared"), &[]);
    for attach in ["first", "again"] {
        let r = gpu(t.pid(), &[], attach);
        assert_eq!(r["subscription"], "shared (multi-subscriber)", "{r}");
        assert!(r["summary"]["kernels"].as_u64().unwrap() > 200, "{r}");
        assert_eq!(r["summary"]["correlated_pct"], 100.0, "{r}");
        assert_eq!(r["agent_unloaded"], true, "{r}");
        // Our subscriber, its callbacks and kinds are gone, CUPTI was not finalized under the
        // other tool, whose hold is intact.
        assert_eq!(t.state_after(Duration::from_millis(300)), OTHER_TOOL);
        nothing_left(&t);
    }
}

#[test]
fn older_cupti_and_drivers_that_cannot_share_are_traced_alone() {
    require_root();
    for (env, version, mode) in [
        (
            ("STALLSCOPE_STANDIN_CUPTI_VERSION", "130000"),
            130000,
            "classic (single subscriber)",
        ),
        (
            ("STALLSCOPE_STANDIN_NO_SHARING", "1"),
            130500,
            "exclusive (per-subscriber API, sharing not available)",
        ),
    ] {
        let t = Target::start("gpu-alone", None, &[env]);
        let dir = tmpdir("gpu-alone-out");
        let trace = dir.join("gpu.pftrace");
        let r = gpu(
            t.pid(),
            &["-o", trace.to_str().unwrap()],
            &format!("{env:?}"),
        );
        assert_eq!(r["cupti_version"], version, "{r}");
        assert_eq!(r["subscription"], mode, "{r}");
        assert!(r["summary"]["kernels"].as_u64().unwrap() > 200, "{r}");
        assert_eq!(r["summary"]["correlated_pct"], 100.0, "{r}");
        // API records carry the kernel's thread ids (the launch calls sit on the target's
        // main thread) and none of the per-launch queries.
        let d = perfetto_writer::read::decode(&std::fs::read(&trace).unwrap()).unwrap();
        let (kernels, pairs) = kernel_calls(&d, t.pid());
        assert_eq!(pairs.len(), kernels, "{env:?}");
        assert_eq!(queries(&d), 0, "{env:?}: cudaGetDevice records were kept");
        // Bit 5 of the state: CUPTI's process-wide thread id setting was put back.
        assert_eq!(t.state_after(Duration::from_millis(300)), 0, "{env:?}");
        nothing_left(&t);
    }
}

/// The highest `GLIBC_x.y[.z]` symbol version named in an ELF file's strings.
fn highest_glibc(elf: &[u8]) -> (u32, u32) {
    let mut best = (0, 0);
    for w in elf.windows(6).enumerate().filter(|(_, w)| *w == b"GLIBC_") {
        let rest = &elf[w.0 + 6..];
        let end = rest
            .iter()
            .position(|c| !(c.is_ascii_digit() || *c == b'.'))
            .unwrap_or(rest.len());
        let v: Vec<u32> = std::str::from_utf8(&rest[..end])
            .unwrap()
            .split('.')
            .filter_map(|n| n.parse().ok())
            .collect();
        if v.len() >= 2 {
            best = best.max((v[0], v[1]));
        }
    }
    best
}

#[test]
fn old_glibc_agent_needs_nothing_past_glibc_2_28() {
    // `cargo xtask setup` builds it with zig next to the binary; the plain build, linked on
    // this host, needs 2.34 (checked too, so the scan is known to see versions).
    let release = std::env::var_os("STALLSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/stallscope")
        })
        .parent()
        .unwrap()
        .to_path_buf();
    let portable = release.join("glibc-2.28/libstallscope_cupti_agent.so");
    let elf = std::fs::read(&portable)
        .unwrap_or_else(|e| panic!("{}: {e} (run cargo xtask setup)", portable.display()));
    assert!(highest_glibc(&elf) <= (2, 28), "{:?}", highest_glibc(&elf));
    let plain = std::fs::read(release.join("libstallscope_cupti_agent.so")).unwrap();
    assert!(
        highest_glibc(&plain) > (2, 28),
        "{:?}",
        highest_glibc(&plain)
    );
}

#[test]
fn clear_errors_without_cupti_or_python() {
    require_root();
    // A Python process with no libcupti mapped and none on the library path.
    let plain = Proc::spawn(
        Command::new(python("3.12")).args(["-c", "import time\nwhile True: time.sleep(0.01)"]),
    );
    std::thread::sleep(Duration::from_millis(500));
    let pid = plain.id().to_string();
    // No NVIDIA driver on this host (CI never has one): nothing is loaded into the target.
    if !Path::new("/dev/nvidiactl").exists() {
        let e = expect_failure(stallscope().args(["gpu", "--pid", &pid]));
        assert!(e.contains("no NVIDIA driver"), "{e}");
    }
    let e = expect_failure(stallscope_standin().args(["gpu", "--pid", &pid]));
    assert!(e.contains("no libcupti"), "{e}");
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", plain.id())).unwrap();
    assert!(!maps.contains("stallscope-gpu-agent"), "agent left mapped");
    // Not Python.
    let sleeper = Proc::spawn(Command::new("sleep").arg("30"));
    let e = expect_failure(stallscope_standin().args(["gpu", "--pid", &sleeper.id().to_string()]));
    assert!(e.contains("not a Python process"), "{e}");
    // No such process.
    let e = expect_failure(stallscope().args(["gpu", "--pid", "999999999"]));
    assert!(e.contains("no such process"), "{e}");
}
