//! `stallscope deep-dive` against a real CPython target: the Perfetto trace is checked by two
//! independent decoders (ours and PyPI perfetto's perfetto_trace_pb2), Python spans are
//! aligned with the kernel's scheduling events of the same thread, and a CPU hog started
//! during the deep-dive window is ranked as CPU contention against the normal reference.

use std::{
    path::Path,
    process::{Child, Command},
    time::{Duration, Instant},
};

use perfetto_writer::read::{self, Decoded, TrackKind};
use serde_json::Value;

mod common;
use common::{
    expect_failure, python_check, require_root, stallscope, start_engine, start_hog,
    start_timed_engine, tmpdir, toy_steps_between, TOY_HOG,
};

const STEP: &str = "__main__:Engine.step";

fn deep_dive(pid: u32, dir: &Path, baseline: &str, duration: &str) -> Command {
    let mut c = stallscope();
    c.args(["deep-dive", "--pid", &pid.to_string()])
        .args(["--watch", &format!("{STEP}[bs=len(batch.reqs)]")])
        .args(["--watch", "__main__:Engine.housekeeping"])
        .args(["--baseline", baseline, "--duration", duration])
        .arg("-o")
        .arg(dir.join("t.pftrace"))
        .arg("--report")
        .arg(dir.join("report.json"));
    c
}

/// Starts `cmd` (a deep dive) with its stderr in `dir`/stderr.txt.
fn spawn_logged(mut cmd: Command, dir: &Path) -> Child {
    cmd.stderr(std::fs::File::create(dir.join("stderr.txt")).unwrap())
        .spawn()
        .unwrap()
}

/// Waits until the deep dive in `dir` says `window` ("normal reference" or "deep-dive") is
/// open; its CLOCK_MONOTONIC ns. The capture's setup (eBPF, probes, samplers) takes a time
/// that depends on the machine, so nothing is timed from the spawn.
fn window_open(dir: &Path, window: &str) -> u64 {
    let want = format!("deep-dive: {window} window open");
    let t = Instant::now();
    loop {
        let err = std::fs::read_to_string(dir.join("stderr.txt")).unwrap_or_default();
        if let Some(line) = err.lines().find(|l| l.starts_with(&want)) {
            let ns = line.rsplit_once("t=").unwrap().1.trim_end_matches(" ns)");
            return ns.parse().unwrap();
        }
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "no \"{want}\" within 60 s:\n{err}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sum of the overlap of `track`'s slices named `name` with [start, end).
fn overlap(d: &Decoded, track: u64, name: &str, start: u64, end: u64) -> u64 {
    d.slices
        .iter()
        .filter(|s| s.track == track && s.name == name)
        .map(|s| s.end.min(end).saturating_sub(s.start.max(start)))
        .sum()
}

#[test]
fn trace_is_valid_aligned_and_a_cpu_hog_ranks_first() {
    require_root();
    let dir = tmpdir("deep-dive");
    let times = dir.join("toy-times.txt");
    let engine = start_timed_engine(&times);
    let pid = engine.id();
    let mut dd = spawn_logged(deep_dive(pid, &dir, "3s", "3s"), &dir);
    // The hog starts inside the deep-dive window (after the 3 s reference).
    let reference_ns = window_open(&dir, "normal reference");
    let split_ns = window_open(&dir, "deep-dive");
    let hog = start_hog("0", TOY_HOG);
    let status = dd.wait().unwrap();
    drop(hog);
    assert!(status.success(), "deep-dive failed: {status}");

    let bytes = std::fs::read(dir.join("t.pftrace")).unwrap();
    let d = read::decode(&bytes).unwrap_or_else(|e| panic!("invalid trace:\n{e}"));
    let py = python_check(&dir.join("t.pftrace"));
    // Both decoders see the same trace.
    assert_eq!(py["packets"].as_u64().unwrap() as usize, d.packets);
    assert_eq!(py["slices"].as_u64().unwrap() as usize, d.slices.len());
    assert!(
        d.clocks.iter().any(|c| c.0 == 3) && d.clocks.iter().any(|c| c.0 == 6),
        "monotonic and boottime readings: {:?}",
        d.clocks
    );

    // The target's main thread has its own track, and the Python spans are on it.
    let main = d
        .tracks
        .values()
        .find(|t| t.kind == TrackKind::Thread { pid, tid: pid })
        .expect("the target's main thread track");
    let steps: Vec<_> = d
        .slices
        .iter()
        .filter(|s| s.track == main.uuid && s.name == STEP)
        .collect();
    // Every step the toy timed in the two windows, but those cut by their edges.
    std::thread::sleep(Duration::from_secs(1));
    let own = toy_steps_between(&times, reference_ns, split_ns + 3_000_000_000);
    assert!(
        steps.len() + 2 >= own && own > 0,
        "{} step spans, the toy timed {own} steps in the windows",
        steps.len()
    );
    assert!(
        steps.iter().all(|s| s.args.contains_key("bs")),
        "bs argument"
    );
    assert!(py["threads"]
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["tid"] == pid && t["pid"] == pid));

    // Each step contains its thread's scheduling events: the step is CPU-bound, so in the
    // normal window its thread is on a CPU for most of it (clocks misaligned by more than a
    // step would break this).
    let state = d
        .tracks
        .values()
        .find(|t| t.parent == Some(main.uuid) && t.name.ends_with(" state"))
        .expect("the main thread's state track");
    let reference = d
        .slices
        .iter()
        .find(|s| s.name == "normal reference")
        .unwrap();
    let normal: Vec<_> = steps
        .iter()
        .filter(|s| s.start >= reference.start && s.end <= reference.end)
        .collect();
    let aligned = normal
        .iter()
        .filter(|s| {
            let covered = ["running", "runnable", "yielded", "sleeping", "blocked (D)"]
                .iter()
                .map(|n| overlap(&d, state.uuid, n, s.start, s.end))
                .sum::<u64>();
            let running = overlap(&d, state.uuid, "running", s.start, s.end);
            covered >= (s.end - s.start) * 99 / 100 && running * 2 >= s.end - s.start
        })
        .count();
    assert!(
        aligned * 10 >= normal.len() * 9,
        "{aligned} of {} steps in the normal window are covered by scheduler states and mostly running",
        normal.len()
    );
    // Telemetry counters and py-spy samples are there.
    let psi = d
        .tracks_named("psi.cpu.some")
        .next()
        .expect("PSI cpu track");
    assert!(d.counters.iter().filter(|c| c.0 == psi.uuid).count() >= 300);
    let in_step = d
        .instants
        .iter()
        .filter(|i| i.name == "Engine.step")
        .count();
    assert!(in_step > 100, "{in_step} py-spy samples in Engine.step");

    // The report ranks CPU contention of the engine's thread first.
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let top = &r["suspects"][0];
    assert!(
        top["kind"] == "thread_state" && top["name"].as_str().unwrap().starts_with("runnable"),
        "top suspect: {top}"
    );
    assert!(top["delta_beta"].as_f64().unwrap() > 0.1, "{top}");
    assert!(r["anomalous_cycle_ms"].as_f64() > r["normal_cycle_ms"].as_f64());
    assert_eq!(r["kernel_lost_ring_full"], 0);
    assert!(
        r["summary"].as_str().unwrap().contains("CPU contention"),
        "{}",
        r["summary"]
    );
    println!("{}", r["summary"]);
}

#[test]
fn target_exit_mid_capture_keeps_what_was_captured() {
    require_root();
    let dir = tmpdir("deep-dive-exit");
    let engine = start_engine();
    let pid = engine.id();
    let mut dd = spawn_logged(deep_dive(pid, &dir, "1s", "5s"), &dir);
    window_open(&dir, "deep-dive");
    std::thread::sleep(Duration::from_secs(1));
    drop(engine);
    let status = dd.wait().unwrap();
    assert!(status.success(), "{status}");
    let d = read::decode(&std::fs::read(dir.join("t.pftrace")).unwrap()).unwrap();
    assert!(d.slices.iter().any(|s| s.name == STEP));
    let r: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("report.json")).unwrap()).unwrap();
    let notes = r["notes"].to_string();
    assert!(notes.contains("exited"), "{notes}");
}

#[test]
fn bad_input_fails_before_touching_the_target() {
    let err = expect_failure(
        stallscope()
            .args(["deep-dive", "--pid", "999999999", "-o"])
            .arg(std::env::temp_dir().join("never.pftrace")),
    );
    assert!(err.contains("no such process"), "{err}");
    // An output path that cannot be created fails before any probe is attached.
    let me = std::process::id().to_string();
    let err = expect_failure(stallscope().args([
        "deep-dive",
        "--pid",
        &me,
        "-o",
        "/nonexistent-dir/t.pftrace",
    ]));
    assert!(err.contains("cannot create the trace file"), "{err}");
}
