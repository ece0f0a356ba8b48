//! stallscope without root: nobody (uid 65534) with only the capabilities README lists runs
//! probe, run and deep-dive on an engine of another user (the toy engine, run by root); with
//! any one of them removed, one clear error names it.

use std::{
    os::unix::fs::PermissionsExt,
    process::Stdio,
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::{
    expect_failure, expect_json, expect_success, free_port, http_get, require_root,
    stallscope_with_caps, start_engine, tmpdir, Proc, CAPABILITIES,
};
use perfetto_writer::read;

const STEP: &str = "__main__:Engine.step";

/// A scratch directory nobody may write in.
fn open_dir(name: &str) -> std::path::PathBuf {
    let dir = tmpdir(name);
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    dir
}

#[test]
fn probe_run_and_deep_dive_work_with_capabilities_alone() {
    require_root();
    let dir = open_dir("caps-only");
    let engine = start_engine();
    let pid = engine.id().to_string();

    let probe = expect_json(stallscope_with_caps(&CAPABILITIES).args([
        "probe",
        "--pid",
        &pid,
        "--duration",
        "2s",
        "--json",
        "--watch",
        STEP,
    ]));
    assert!(
        !probe["threads"].as_array().unwrap().is_empty()
            && probe["calls"].as_array().unwrap().len() > 50,
        "probe as nobody: {} threads, {} calls",
        probe["threads"],
        probe["calls"].as_array().map_or(0, Vec::len)
    );

    let trace = dir.join("t.pftrace");
    expect_success(
        stallscope_with_caps(&CAPABILITIES)
            .args([
                "deep-dive",
                "--pid",
                &pid,
                "--baseline",
                "1s",
                "--duration",
                "1s",
                "--watch",
                STEP,
                "-o",
            ])
            .arg(&trace),
    );
    let d = read::decode(&std::fs::read(&trace).unwrap()).unwrap();
    assert!(
        d.slices.iter().any(|s| s.name == STEP),
        "no step in the trace"
    );

    // The daemon, from a configuration that holds only what it changes.
    let port = free_port();
    let cfg = dir.join("config.toml");
    std::fs::write(
        &cfg,
        format!(
            "[watch]\npids = [{pid}]\n[sentinel]\nframework = \"generic\"\nwatch = [\"{STEP}\"]\n[http]\nlisten = \"127.0.0.1:{port}\"\n[state]\ndir = \"{}\"\n",
            dir.join("state").display()
        ),
    )
    .unwrap();
    let log = dir.join("daemon.log");
    let mut daemon = Proc::spawn(
        stallscope_with_caps(&CAPABILITIES)
            .args(["run", "--config"])
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the daemon as nobody does not serve:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let iterations = || -> u64 {
        let Ok(s) = serde_json::from_str::<Value>(&http_get(port, "/api/v1/status")) else {
            return 0;
        };
        s["engines"][0]["iterations"]
            .as_object()
            .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
    };
    while iterations() < 100 {
        assert!(
            t.elapsed() < Duration::from_secs(40),
            "the daemon as nobody counted no iterations:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    // Without CAP_SYS_NICE the verdicts run at the normal policy, said once.
    assert!(
        http_get(port, "/metrics").contains("\nstallscope_verdict_realtime 0\n"),
        "the daemon as nobody claims real-time verdicts"
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert_eq!(
        said.matches("the loop thread keeps the normal scheduling policy")
            .count(),
        1,
        "{said}"
    );
    // SAFETY: kill(2) on our child (setpriv execs stallscope in place).
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    let status = daemon.child().wait().unwrap();
    assert!(
        status.success(),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
}

#[test]
fn each_missing_capability_is_named_in_one_error() {
    require_root();
    let engine = start_engine();
    let pid = engine.id().to_string();
    for (removed, says) in [
        ("bpf", "missing privileges (CAP_BPF)"),
        ("perfmon", "missing privileges (CAP_PERFMON)"),
        ("sys_ptrace", "CAP_SYS_PTRACE"),
        ("chown", "needs CAP_CHOWN"),
        ("dac_read_search", "needs CAP_DAC_READ_SEARCH"),
    ] {
        let caps: Vec<&str> = CAPABILITIES
            .iter()
            .copied()
            .filter(|c| *c != removed)
            .collect();
        let e = expect_failure(stallscope_with_caps(&caps).args([
            "probe",
            "--pid",
            &pid,
            "--duration",
            "1s",
            "--watch",
            STEP,
        ]));
        assert!(e.contains(says), "without {removed}: {e}");
        assert_eq!(
            e.lines()
                .filter(|l| l.starts_with("error") || l.starts_with("Error"))
                .count(),
            1,
            "without {removed}, one error: {e}"
        );
    }
}
