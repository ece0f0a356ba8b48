//! An engine stallscope has no profile for: LitServe (PyPI `litserve`, pinned in `cargo xtask
//! setup`) serving a batched CPU "model" (`tools/litserve_engine.py`) from its own inference
//! worker, a process it spawns. The daemon is configured only through `watch` specs in its
//! TOML: it discovers the iteration anchor among them, reads the workload from the arguments
//! of LitServe's call into the model, fits its baseline and alerts under a CPU hog on the
//! worker's CPU.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use common::daemon::Daemon;
use common::{
    expect_success, free_port, http_get, require_root, start_hog, tmpdir, tool_python, Hog, Proc,
};
use serde_json::Value;

/// The watched calls: LitServe's call into the model (the user's `predict`, in the module
/// multiprocessing's spawn names `__mp_main__`), and two of LitServe's own per-request calls.
const WATCH: [&str; 3] = [
    "__mp_main__:TokenAPI.predict[batch=len(xs);context_tokens=sum(xs)]",
    "litserve.loops.base:LitLoop.put_response",
    "litserve.callbacks.base:CallbackRunner.trigger_event",
];
const ANCHOR: &str = "__mp_main__:TokenAPI.predict";

/// Tokens per request, from the load's generator.
const TOKENS: std::ops::RangeInclusive<u64> = 16..=128;
/// Requests in flight at once (LitServe batches up to 4).
const CLIENTS: usize = 3;

/// Healthy load after the fit in which no alert may open.
const STEADY: Duration = Duration::from_secs(20);

/// Two of every 3 ms on the worker's CPU (SCHED_FIFO), finer than a batch: every batch takes
/// about three times as long.
const HOG: Hog = Hog {
    spin: Duration::from_millis(2),
    sleep: Duration::from_millis(1),
};

#[test]
fn a_litserve_worker_watched_only_by_specs_gets_its_anchor_baseline_and_an_alert_under_a_hog() {
    require_root();
    let dir = tmpdir("litserve");
    let port = free_port();
    // The server starts on CPU 1; once its worker is known, everything else moves to CPU 0 and
    // the worker has CPU 1, where the hog goes, to itself.
    let server = Proc::spawn(
        Command::new("taskset")
            .args(["-c", "1"])
            .arg(tool_python("litserve-venv"))
            .arg(script())
            .arg(port.to_string()),
    );
    wait_until("LitServe's /health", Duration::from_secs(90), || {
        sys_util::http::get(port, "/health", Duration::from_secs(5)).is_ok_and(|r| r.status == 200)
    });
    let worker = inference_worker(server.id());
    for pid in process_tree(server.id())
        .into_iter()
        .filter(|&p| p != worker)
    {
        expect_success(
            Command::new("taskset")
                .args(["-a", "-p", "-c", "0"])
                .arg(pid.to_string()),
        );
    }
    pin_this_process_to_cpu0();
    let load = Load::start(port);
    let daemon_port = free_port();
    let mut d = Daemon::start_with(&dir, daemon_port, config(&dir, worker, daemon_port));
    d.wait_for("the discovered anchor", Duration::from_secs(60), |d| {
        d.engine().is_some_and(|e| e["anchor"].is_string())
    });
    let e = d.engine().unwrap();
    assert_eq!(e["anchor"], ANCHOR, "{e}");
    assert_eq!(e["framework"], "generic", "{e}");
    d.wait_for("fitted model", Duration::from_secs(120), |d| {
        d.engine().is_some_and(|e| e["model_state"] == "fitted")
    });
    eprintln!("fitted: {}", d.engine().unwrap_or_default());

    // Healthy load: no alert.
    let t = Instant::now();
    while t.elapsed() < STEADY {
        let e = d.engine().unwrap();
        assert_eq!(
            e["anomaly_active"],
            false,
            "an alert under healthy load: {e}\nalerts: {}",
            http_get(d.port, "/api/v1/alerts")
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    let healthy_iterations = d.iterations();

    // The hog on the worker's CPU: an alert, whose iterations ran well over the prediction.
    let hog = start_hog("1", HOG);
    let t = Instant::now();
    while !d.engine().is_some_and(|e| e["anomaly_active"] == true) {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "no alert within 30 s of the hog; engine: {}\ndaemon log:\n{}",
            d.engine().unwrap_or_default(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let lag = t.elapsed();
    drop(hog);
    let alerts: Value = serde_json::from_str(&http_get(d.port, "/api/v1/alerts")).unwrap();
    let a = &alerts[0];
    assert_eq!(a["pid"], worker, "{a}");
    assert!(a["slowdown"].as_f64().unwrap() >= 1.2, "{a}");
    let (served, failed) = load.stop();
    assert!(
        failed.is_empty(),
        "{} of {} requests failed while the worker was watched: {:?}",
        failed.len(),
        served + failed.len() as u64,
        &failed[..failed.len().min(5)]
    );
    eprintln!(
        "LitServe: {served} requests served; {healthy_iterations} iterations before the hog; alert {lag:.1?} after it: {a}"
    );

    // Every iteration's workload came from predict's arguments: its batch of 1-4 requests and
    // their tokens. The export is flushed once a second, and at the daemon's exit.
    let status = d.stop();
    assert!(status.success(), "the daemon exited with {status}");
    let csv = std::fs::read_to_string(dir.join("iterations.csv")).unwrap();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert!(
        rows.len() as u64 >= healthy_iterations,
        "{} rows",
        rows.len()
    );
    for r in &rows {
        let batch: f64 = r[3].parse().unwrap();
        let per_request: f64 = r[4].parse().unwrap();
        assert!((1.0..=4.0).contains(&batch), "{r:?}");
        assert!(
            (*TOKENS.start() as f64..=*TOKENS.end() as f64).contains(&per_request),
            "{r:?}"
        );
    }
    assert!(
        rows.iter().any(|r| r[3] != "1"),
        "LitServe never batched two requests"
    );
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/litserve_engine.py")
}

fn config(dir: &Path, worker: u32, port: u16) -> PathBuf {
    let watch: Vec<String> = WATCH.iter().map(|w| format!("{w:?}")).collect();
    let text = format!(
        r#"[watch]
pids = [{worker}]
process_patterns = []

[sentinel]
engine_patterns = []
framework = "generic"
watch = [{watch}]
warmup_samples = 400

[deep_dive]
on_alert = false

[http]
listen = "127.0.0.1:{port}"

[state]
dir = "{dir}"
alerts_log = ""
iterations_csv = "{dir}/iterations.csv"
"#,
        watch = watch.join(", "),
        dir = dir.display()
    );
    let path = dir.join("stallscope.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// LitServe's inference worker: the child of `server` that multiprocessing's spawn started.
fn inference_worker(server: u32) -> u32 {
    let mut found = None;
    wait_until(
        "LitServe's inference worker",
        Duration::from_secs(30),
        || {
            found = parents().into_iter().find_map(|(pid, ppid)| {
                let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
                (ppid == server && String::from_utf8_lossy(&cmdline).contains("spawn_main"))
                    .then_some(pid)
            });
            found.is_some()
        },
    );
    found.unwrap()
}

/// Every process and its parent.
fn parents() -> Vec<(u32, u32)> {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|p| {
            let pid: u32 = p.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(p.path().join("stat")).ok()?;
            let ppid = sys_util::task_state::stat_fields(&stat)
                .get(1)?
                .parse()
                .ok()?;
            Some((pid, ppid))
        })
        .collect()
}

/// `root` and its descendants.
fn process_tree(root: u32) -> Vec<u32> {
    let parents = parents();
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

/// The test's own threads (the load's clients) off the worker's CPU.
fn pin_this_process_to_cpu0() {
    expect_success(
        Command::new("taskset")
            .args(["-a", "-p", "-c", "0"])
            .arg(std::process::id().to_string()),
    );
}

fn wait_until(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(t.elapsed() < limit, "no {what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Requests kept in flight by [`CLIENTS`] threads, their tokens drawn from [`TOKENS`].
struct Load {
    stop: Arc<AtomicBool>,
    served: Arc<AtomicU64>,
    failed: Arc<Mutex<Vec<String>>>,
    clients: Vec<JoinHandle<()>>,
}

impl Load {
    fn start(port: u16) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let served = Arc::new(AtomicU64::new(0));
        let failed = Arc::new(Mutex::new(Vec::new()));
        let started = Instant::now();
        let clients = (0..CLIENTS as u64)
            .map(|i| {
                let (stop, served, failed) = (stop.clone(), served.clone(), failed.clone());
                std::thread::spawn(move || {
                    let mut x = 0x9e37_79b9_7f4a_7c15_u64 ^ i;
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                        let span = TOKENS.end() - TOKENS.start() + 1;
                        let tokens = TOKENS.start() + (x >> 33) % span;
                        let r = sys_util::http::post_json(
                            port,
                            "/predict",
                            &format!("{{\"tokens\": {tokens}}}"),
                            Duration::from_secs(60),
                        );
                        match r {
                            Ok(r) if r.status == 200 => {
                                served.fetch_add(1, Ordering::Relaxed);
                            }
                            other => failed.lock().unwrap().push(format!(
                                "{:?} after the load started: {other:?}",
                                started.elapsed()
                            )),
                        }
                    }
                })
            })
            .collect();
        Load {
            stop,
            served,
            failed,
            clients,
        }
    }

    /// Stops the clients; how many requests were answered, and the requests that failed.
    fn stop(self) -> (u64, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().unwrap();
        }
        let failed = std::mem::take(&mut *self.failed.lock().unwrap());
        (self.served.load(Ordering::Relaxed), failed)
    }
}
