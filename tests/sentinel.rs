//! End-to-end tests of `stallscope run` (the sentinel daemon) and of `stallscope fit/predict`
//! against real processes: a toy Python engine (tests/targets/py_engine.py) whose steps slow
//! down when its CPU is contended, a real Prometheus server and promtool. The vLLM end-to-end
//! test is tests/sentinel_vllm.rs.

use std::{
    io::Write,
    net::{TcpListener, TcpStream},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::{
    expect_failure, expect_success, free_port, http_get, require_root, stallscope, start_engine,
    start_hog, tmpdir, Proc,
};

/// The daemon, configured for a generic engine, with its log in `dir/daemon.log`.
struct Daemon {
    child: Option<Child>,
    port: u16,
    dir: PathBuf,
}

fn config(dir: &Path, pid: u32, port: u16, warmup: usize) -> PathBuf {
    let text = format!(
        r#"
[watch]
pids = [{pid}]
process_patterns = []
rescan_interval = "500ms"

[report]
interval = "1s"

[sentinel]
engine_patterns = []
framework = "generic"
watch = ["__main__:Engine.step[batch=len(batch.reqs);context_tokens=batch.context]", "__main__:Engine.housekeeping"]
poll_interval = "1ms"
theta_max = 0.5
k_sigma = 3.0
window = 10
start_after = 5
warmup_samples = {warmup}
refit_every = 0
max_training_samples = 20000
alert_on_prefill = false

[http]
listen = "127.0.0.1:{port}"

[state]
dir = "{dir}"
alerts_log = ""
iterations_csv = "{dir}/iterations.csv"
"#,
        dir = dir.display()
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

impl Daemon {
    fn start(dir: &Path, pid: u32, warmup: usize) -> Daemon {
        let port = free_port();
        let cfg = config(dir, pid, port, warmup);
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let child = stallscope()
            .arg("run")
            .arg("--config")
            .arg(cfg)
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Daemon {
            child: Some(child),
            port,
            dir: dir.to_path_buf(),
        };
        d.wait_for("the HTTP API", Duration::from_secs(30), |d| {
            TcpStream::connect(("127.0.0.1", d.port)).is_ok()
        });
        d
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    fn status(&self) -> Value {
        serde_json::from_str(&http_get(self.port, "/api/v1/status")).unwrap()
    }

    fn engine(&self) -> Option<Value> {
        self.status()["engines"].as_array()?.first().cloned()
    }

    fn wait_for(&self, what: &str, limit: Duration, ok: impl Fn(&Daemon) -> bool) {
        let t = Instant::now();
        while !ok(self) {
            assert!(
                t.elapsed() < limit,
                "no {what} within {limit:?}; daemon log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// SIGTERM, then the exit status.
    fn stop(&mut self) -> ExitStatus {
        let mut c = self.child.take().unwrap();
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
        c.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[test]
fn discovers_the_anchor_fits_alerts_on_cpu_contention_and_reuses_its_model() {
    require_root();
    let dir = tmpdir("alert");
    let engine = start_engine();
    let pid = engine.0.id();
    let mut d = Daemon::start(&dir, pid, 300);
    // No profile: the anchor is found among the two watched functions (10 s window).
    d.wait_for("discovered anchor", Duration::from_secs(30), |d| {
        d.engine()
            .is_some_and(|e| e["anchor"] == "__main__:Engine.step")
    });
    d.wait_for("fitted model", Duration::from_secs(60), |d| {
        d.engine().is_some_and(|e| e["model_state"] == "fitted")
    });
    let e = d.engine().unwrap();
    assert!(e["model_samples"].as_u64().unwrap() >= 300, "{e}");
    let ucl = e["ucl"].as_f64().unwrap();
    assert!(ucl > 0.0 && ucl <= 0.5, "{e}");
    // Steady: no alert.
    std::thread::sleep(Duration::from_secs(5));
    let alerts: Value = serde_json::from_str(&http_get(d.port, "/api/v1/alerts")).unwrap();
    assert_eq!(alerts.as_array().unwrap().len(), 0, "false alert: {alerts}");
    // A CPU hog on the engine's CPU: an alert within seconds.
    let hog = start_hog();
    let t = Instant::now();
    d.wait_for("alert", Duration::from_secs(10), |d| {
        d.engine().is_some_and(|e| e["anomaly_active"] == true)
    });
    let lag = t.elapsed();
    drop(hog);
    let alerts: Value = serde_json::from_str(&http_get(d.port, "/api/v1/alerts")).unwrap();
    let a = &alerts[0];
    assert_eq!(a["pid"], pid);
    assert!(
        a["moving_mean"].as_f64().unwrap() > a["ucl"].as_f64().unwrap(),
        "{a}"
    );
    // The moving mean is over the alert, not the triggering iteration alone: that one may be fast.
    assert!(a["predicted_us"].as_f64().unwrap() > 0.0, "{a}");
    let m = http_get(d.port, "/metrics");
    assert_eq!(metric(&m, "stallscope_alerts_total"), 1.0, "{m}");
    assert!(metric(&m, "stallscope_iterations_total") >= 300.0);
    assert!(
        metric(&m, "stallscope_thread_seconds_total") > 0.0,
        "kernel time of the engine threads"
    );
    println!("alert {lag:?} after the hog started: {a}");
    // The alert ends once the hog is gone, and both events are in the log.
    d.wait_for("alert end", Duration::from_secs(20), |d| {
        d.engine().is_some_and(|e| e["anomaly_active"] == false)
    });
    let log = std::fs::read_to_string(dir.join("alerts.jsonl")).unwrap();
    let events: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events[0]["event"], "alert_start");
    assert!(events.iter().any(|e| e["event"] == "alert_end"), "{log}");
    assert!(d.stop().success(), "{}", d.log());
    // The export has every iteration in the LatencyPrism schema: `stallscope fit` reads it.
    let csv = std::fs::read_to_string(dir.join("iterations.csv")).unwrap();
    assert!(csv.starts_with("job_name,start_ts,duration_us,batch_size,avg_input_length"));
    assert!(csv.lines().count() > 300);
    // Restart: the persisted model of the same fingerprint is used at once.
    let d2 = Daemon::start(&dir, pid, 300);
    d2.wait_for("engine", Duration::from_secs(20), |d| d.engine().is_some());
    let e2 = d2.engine().unwrap();
    assert_eq!(e2["model_state"], "fitted", "{e2}");
    assert_eq!(e2["fingerprint"], e["fingerprint"]);
    assert!(d2.log().contains("reusing the model"), "{}", d2.log());
}

#[test]
fn metrics_pass_promtool_and_a_real_prometheus_scrapes_them() {
    require_root();
    let dir = tmpdir("prom");
    let engine = start_engine();
    let d = Daemon::start(&dir, engine.0.id(), 100_000);
    d.wait_for("iterations", Duration::from_secs(30), |d| {
        metric(&http_get(d.port, "/metrics"), "stallscope_iterations_total") > 0.0
    });
    let text = http_get(d.port, "/metrics");
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .output_with_stdin(text.as_bytes());
    assert!(check.0.success(), "promtool: {}\n{text}", check.1);
    check.1.clear();
    // A Prometheus server scraping the daemon every second.
    let prom_port = free_port();
    std::fs::write(
        dir.join("prometheus.yml"),
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: stallscope\n    static_configs:\n      - targets: ['127.0.0.1:{}']\n",
            d.port
        ),
    )
    .unwrap();
    let _prom = Proc(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{prom_port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.join("prometheus.log")).unwrap())
            .process_group(0)
            .spawn()
            .expect("prometheus (Debian package prometheus; cargo xtask setup installs it)"),
    );
    let t = Instant::now();
    loop {
        let r = TcpStream::connect(("127.0.0.1", prom_port))
            .ok()
            .map(|_| http_get(prom_port, "/api/v1/query?query=stallscope_iterations_total"));
        if let Some(body) = r {
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["data"]["result"]
                .as_array()
                .is_some_and(|r| !r.is_empty())
            {
                let up: Value =
                    serde_json::from_str(&http_get(prom_port, "/api/v1/query?query=up")).unwrap();
                assert_eq!(up["data"]["result"][0]["value"][1], "1", "{up}");
                break;
            }
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "Prometheus never stored a stallscope series: {}",
            std::fs::read_to_string(dir.join("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Runs a command with `input` on stdin; (status, stdout + stderr).
trait WithStdin {
    fn output_with_stdin(&mut self, input: &[u8]) -> (ExitStatus, String);
}

impl WithStdin for Command {
    fn output_with_stdin(&mut self, input: &[u8]) -> (ExitStatus, String) {
        let mut c = self
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(input).unwrap();
        let out = c.wait_with_output().unwrap();
        (
            out.status,
            String::from_utf8_lossy(&out.stdout).into_owned()
                + &String::from_utf8_lossy(&out.stderr),
        )
    }
}

#[test]
fn engine_exit_is_survived_and_sigterm_exits_cleanly() {
    require_root();
    let dir = tmpdir("exit");
    let mut engine = start_engine();
    let mut d = Daemon::start(&dir, engine.0.id(), 100_000);
    d.wait_for("engine", Duration::from_secs(20), |d| d.engine().is_some());
    engine.0.kill().unwrap();
    engine.0.wait().unwrap();
    d.wait_for("engine removed", Duration::from_secs(10), |d| {
        d.engine().is_none()
    });
    assert!(d.log().contains("exited"), "{}", d.log());
    // Still serving.
    assert!(http_get(d.port, "/metrics").contains("stallscope_"));
    assert!(d.stop().success(), "{}", d.log());
}

#[test]
fn bad_input_fails_with_one_clear_error() {
    let dir = tmpdir("bad");
    // Port in use.
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = config(&dir, std::process::id(), port, 1000);
    let e = expect_failure(stallscope().arg("run").arg("--config").arg(&cfg));
    assert!(
        e.contains("cannot listen on 127.0.0.1") && e.contains("--listen"),
        "{e}"
    );
    // Configuration errors name the key.
    let bad = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("window = 10", "window = 0");
    std::fs::write(dir.join("bad.toml"), bad).unwrap();
    let e = expect_failure(
        stallscope()
            .arg("run")
            .arg("--config")
            .arg(dir.join("bad.toml")),
    );
    assert!(e.contains("sentinel.window"), "{e}");
    let e = expect_failure(stallscope().args(["run", "--config", "/nonexistent.toml"]));
    assert!(
        e.contains("cannot read configuration file /nonexistent.toml"),
        "{e}"
    );
    // No such engine pid.
    let free = free_port();
    let e = expect_failure(
        stallscope()
            .args([
                "run",
                "--pid",
                "999999999",
                "--listen",
                &format!("127.0.0.1:{free}"),
                "--state-dir",
            ])
            .arg(&dir),
    );
    assert!(e.contains("no process with pid 999999999"), "{e}");
    // A table without the workload columns.
    std::fs::write(dir.join("short.csv"), "duration_us,batch_size\n100,1\n").unwrap();
    let e = expect_failure(
        stallscope()
            .args(["fit", "-o"])
            .arg(dir.join("m.json"))
            .arg("--csv")
            .arg(dir.join("short.csv")),
    );
    assert!(
        e.contains("missing column(s) avg_input_length, avg_output_length"),
        "{e}"
    );
    // A corrupt model file.
    std::fs::write(dir.join("corrupt.json"), "{\"format\":1,\"gbdt\":").unwrap();
    let e = expect_failure(
        stallscope()
            .arg("predict")
            .arg("--model")
            .arg(dir.join("corrupt.json"))
            .arg("--csv")
            .arg(dir.join("short.csv")),
    );
    assert!(e.contains("corrupt") && e.contains("stallscope fit"), "{e}");
}

#[test]
fn fit_then_predict_one_duration_per_row_in_order() {
    let dir = tmpdir("fit");
    let mut csv = String::from("job_name,start_ts,duration_us,batch_size,avg_input_length,max_input_length,avg_output_length,max_output_length\n");
    for i in 0..600u32 {
        let b = 1 + i % 16;
        let (li, lo) = (100 + (i * 37) % 400, (i * 11) % 200);
        let d = 20_000.0 + 500.0 * b as f64 + 0.05 * (b * (li + lo)) as f64;
        csv += &format!("j{},{i},{d},{b},{li},{li},{lo},{lo}\n", i % 5);
    }
    std::fs::write(dir.join("train.csv"), &csv).unwrap();
    let out = expect_success(
        stallscope()
            .args(["fit", "--csv"])
            .arg(dir.join("train.csv"))
            .arg("-o")
            .arg(dir.join("m.json")),
    );
    let summary: Value = serde_json::from_slice(&out).unwrap();
    assert!(
        summary["oof_accuracy"]["mape_pct"].as_f64().unwrap() < 5.0,
        "{summary}"
    );
    std::fs::write(
        dir.join("q.csv"),
        "batch_size,avg_input_length,avg_output_length\n1,100,0\n16,500,200\n4,300,50\n",
    )
    .unwrap();
    let run = |fmt: &str| {
        let o = expect_success(
            stallscope()
                .args(["predict", "--format", fmt, "--model"])
                .arg(dir.join("m.json"))
                .arg("--csv")
                .arg(dir.join("q.csv")),
        );
        String::from_utf8(o).unwrap()
    };
    let json: Vec<f64> = serde_json::from_str(&run("json")).unwrap();
    assert_eq!(json.len(), 3);
    let expect = [
        20_500.0,
        20_000.0 + 8000.0 + 0.05 * 16.0 * 700.0,
        20_000.0 + 2000.0 + 0.05 * 4.0 * 350.0,
    ];
    for (p, e) in json.iter().zip(expect) {
        assert!(((p - e) / e).abs() < 0.05, "predicted {p}, truth {e}");
    }
    let csv_out = run("csv");
    let lines: Vec<&str> = csv_out.lines().collect();
    assert_eq!(lines[0], "predicted_us");
    assert_eq!(lines.len(), 4);
    for (l, p) in lines[1..].iter().zip(&json) {
        assert!((l.parse::<f64>().unwrap() - p).abs() < 0.01);
    }
}
