//! `cargo xtask gpu-check [--out DIR]`: the GPU plane on a real GPU (a machine with a driver
//! and PyTorch; the release binaries built beforehand, so it also runs where there is no Rust
//! toolchain: `target/release/xtask gpu-check` from the repository root).
//!
//! Two warm decode loops (tests/targets/gpu_decode.py): `llama`, eager PyTorch bound by its
//! kernel launches, and `gemv`, bound by the GPU. Phases, each reported even when another
//! fails:
//! - `env`: the GPU, driver, CUDA, PyTorch and CUPTI versions, and `stallscope check`.
//! - `attach` ([`attach`]), on each loop: `stallscope gpu` attached and detached in turn:
//!   counts, correlation join, clock alignment, throughput cost, clean detach.
//! - `sampled` ([`sampled`]), on each loop: `stallscope gpu --sample` against detached
//!   windows: the cost while traced, while not, and of each switch.
//! - `deep_dive_cli`, on `llama`: `stallscope deep-dive` (GPU tracks, NVML counters).
//! - `sentinel` ([`sentinel`]), on `gemv`: the daemon: per-iteration GPU figures, a
//!   steady window, the GPU injectors with the loop's measured slowdown and the alerts, the
//!   alert's deep dive (GPU tracks, NVML counters, decoded by the PyPI `perfetto` package too),
//!   and a clean exit.
//!
//! The report (`report.json`) ends with each goal and whether it was met.

mod attach;
mod decode_loop;
mod sampled;
mod sentinel;

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use crate::{root, stallscope_bin};
use decode_loop::DecodeLoop;

fn text(cmd: &mut Command) -> String {
    match cmd.output() {
        Ok(o) => format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout).trim(),
            if o.status.success() {
                String::new()
            } else {
                format!(
                    " [exit {:?}: {}]",
                    o.status.code(),
                    String::from_utf8_lossy(&o.stderr).trim()
                )
            }
        ),
        Err(e) => format!("cannot run: {e}"),
    }
}

/// What the machine is: GPU, driver, CUDA, PyTorch, CUPTI, kernel, and stallscope's own check.
fn env(python: &str, bin: &Path) -> Value {
    json!({
        "gpu": text(Command::new("nvidia-smi").args(["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"])),
        "torch": text(Command::new(python).args(["-c", "import torch, glob, os; d = os.path.dirname(torch.__file__); print(torch.__version__, torch.version.cuda, sorted(glob.glob(os.path.join(d, '..', 'nvidia', '**', 'libcupti.so*'), recursive=True)))"])),
        "cupti_version": text(Command::new(python).args(["-c", "import torch, ctypes, glob, os; d = os.path.dirname(torch.__file__); p = sorted(glob.glob(os.path.join(d, '..', 'nvidia', '**', 'libcupti.so*'), recursive=True)); v = ctypes.c_uint32(); ctypes.CDLL(p[0]).cuptiGetVersion(ctypes.byref(v)); print(v.value, p[0])"])),
        "kernel": text(Command::new("uname").arg("-r")),
        "btf": Path::new("/sys/kernel/btf/vmlinux").exists(),
        "stallscope_check": text(Command::new(bin).arg("check")),
    })
}

/// GPU tracks, CUDA API calls, NVML counters and the perfetto package's verdict on a trace.
pub fn trace_facts(trace: &Path, pid: u32) -> Value {
    let bytes = match std::fs::read(trace) {
        Ok(b) => b,
        Err(e) => return json!({"error": format!("{}: {e}", trace.display())}),
    };
    let d = match perfetto_writer::read::decode(&bytes) {
        Ok(d) => d,
        Err(e) => return json!({"error": e}),
    };
    let named = |f: &dyn Fn(&str) -> bool| -> Vec<u64> {
        d.tracks
            .values()
            .filter(|t| f(&t.name))
            .map(|t| t.uuid)
            .collect()
    };
    let streams = named(&|n| n.starts_with("GPU ") && n.contains(" stream "));
    let api = named(&|n| n == "CUDA API");
    let on = |ids: &[u64]| d.slices.iter().filter(|s| ids.contains(&s.track)).count();
    let flows_on = |ids: &[u64]| {
        d.slices
            .iter()
            .filter(|s| ids.contains(&s.track) && !s.flows.is_empty())
            .count()
    };
    let mut nvml: Vec<(String, usize)> = d
        .tracks
        .values()
        .filter(|t| t.name.starts_with("gpu") && t.name.contains('.'))
        .map(|t| {
            (
                t.name.clone(),
                d.counters.iter().filter(|c| c.0 == t.uuid).count(),
            )
        })
        .collect();
    nvml.sort();
    let perfetto_py = std::env::var("STALLSCOPE_GPU_PYTHON").unwrap_or_else(|_| "python3".into());
    let check = Command::new(perfetto_py)
        .arg(root().join("tests/tools/check_perfetto.py"))
        .arg(trace)
        .env(
            "PYTHONPATH",
            std::env::var("STALLSCOPE_PERFETTO_PYTHONPATH").unwrap_or_default(),
        )
        .output();
    let perfetto_package = match check {
        Ok(o) if o.status.success() => {
            let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
            json!({"ok": true, "slices": v["slices"], "counters": v["counters"], "threads": v["threads"].as_array().map(|a| a.len())})
        }
        Ok(o) => {
            json!({"ok": false, "stderr": String::from_utf8_lossy(&o.stderr).chars().take(2000).collect::<String>()})
        }
        Err(e) => json!({"ok": false, "stderr": e.to_string()}),
    };
    json!({
        "path": trace,
        "bytes": bytes.len(),
        "stream_tracks": streams.len(),
        "gpu_slices": on(&streams),
        "gpu_slices_with_flow": flows_on(&streams),
        "api_tracks": api.len(),
        "api_calls": on(&api),
        "api_calls_of_target": d.slices.iter().filter(|s| api.contains(&s.track) && d.thread_of(s.track) == Some(pid)).count(),
        "nvml_counters": nvml,
        "perfetto_package": perfetto_package,
    })
}

/// `stallscope deep-dive` on the loop for 2 s.
fn deep_dive(bin: &Path, target: &DecodeLoop, dir: &Path) -> Result<Value> {
    let trace = dir.join("deep-dive.pftrace");
    let out = Command::new(bin)
        .args([
            "deep-dive",
            "--pid",
            &target.pid.to_string(),
            "--duration",
            "2s",
            "-o",
        ])
        .arg(&trace)
        .output()?;
    if !out.status.success() {
        bail!(
            "stallscope deep-dive failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(json!({
        "stderr": String::from_utf8_lossy(&out.stderr).trim(),
        "trace": trace_facts(&trace, target.pid),
        "footprint_after": target.footprint().json(),
    }))
}

/// Runs a phase, keeping its error in the report instead of stopping the check.
fn phase(name: &str, f: impl FnOnce() -> Result<Value>) -> Value {
    eprintln!("gpu-check: {name}");
    f().unwrap_or_else(|e| {
        eprintln!("gpu-check: {name} failed: {e:#}");
        json!({"error": format!("{e:#}")})
    })
}

/// Each goal of the check: (name, measured, met).
fn goals(r: &Value) -> Value {
    let a = &r["attach"];
    let l = &r["llama"]["attach"];
    let s = &r["sentinel"];
    let detected = |sc: &str| {
        s["injections"]
            .as_array()
            .and_then(|v| v.iter().find(|i| i["scenario"] == sc))
            .map(|i| {
                (
                    i["detected"].clone(),
                    i["slowdown"]["worst_second_x"].clone(),
                )
            })
    };
    let zeros = |v: &Value| {
        v.as_array()
            .is_some_and(|v| !v.is_empty() && v.iter().all(|x| x.as_u64() == Some(0)))
    };
    let lost_zero = [a, l]
        .iter()
        .all(|a| zeros(&a["lost_events"]) && zeros(&a["cupti_dropped"]));
    let join = [a, l]
        .iter()
        .filter_map(|a| a["correlated_pct_min"].as_f64())
        .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.min(x))));
    let clean = [a, l]
        .iter()
        .all(|a| a["clean_detach"] == true && a["agent_unloaded"] == true)
        && s["clean_exit"] == true;
    let mut g = vec![
        json!({"goal": "join rate >= 99 % (both loops)", "measured": join, "met": join.is_some_and(|x| x >= 99.0)}),
        json!({"goal": "clock alignment p99 <= 10 us", "measured_ns": a["alignment_error_ns"]["p99"], "met": a["alignment_error_ns"]["p99"].as_u64().is_some_and(|x| x <= 10_000)}),
        json!({"goal": "attached throughput cost <= 1 % (GPU-bound loop)", "measured_pct": a["overhead_pct"], "per_round": a["overhead_pct_per_round"], "met": a["overhead_pct"].as_f64().is_some_and(|x| x <= 1.0)}),
        json!({"goal": "attached throughput cost <= 1 % (launch-bound eager loop)", "measured_pct": l["overhead_pct"], "per_round": l["overhead_pct_per_round"], "met": l["overhead_pct"].as_f64().is_some_and(|x| x <= 1.0)}),
        json!({"goal": "clock alignment p99 <= 10 us (launch-bound loop)", "measured_ns": l["alignment_error_ns"], "met": l["alignment_error_ns"]["p99"].as_u64().is_some_and(|x| x <= 10_000)}),
        json!({"goal": "0 lost records", "measured": [a["lost_events"], a["cupti_dropped"], l["lost_events"], l["cupti_dropped"]], "met": lost_zero}),
        json!({"goal": "clean detach (gpu, both loops) and clean daemon exit", "measured": [a["clean_detach"], a["agent_unloaded"], l["clean_detach"], l["agent_unloaded"], s["clean_exit"]], "met": clean}),
    ];
    for (loop_, sampled) in [
        ("GPU-bound", &r["sampled"]),
        ("launch-bound", &r["llama"]["sampled"]),
    ] {
        let d = &sampled["derived_cost_pct"];
        g.push(json!({"goal": format!("throughput cost <= 1 % sampled at {} ({loop_} loop; derived from the traced, untraced and switch costs)", d["sampling"].as_str().unwrap_or("?")), "measured_pct": d["pct"], "parts": sampled["cost_pct"], "met": d["pct"].as_f64().is_some_and(|x| x <= 1.0)}));
    }
    for sc in ["gemm-contention", "pcie-saturation"] {
        let d = detected(sc);
        g.push(json!({"goal": format!("{sc} slows the loop and is detected"), "measured": d.as_ref().map(|d| json!({"detected": d.0, "worst_second_x": d.1})), "met": d.is_some_and(|d| d.0 == true)}));
    }
    Value::Array(g)
}

/// Runs the check; writes `<out>/report.json` and prints it. `rounds`: A/B rounds on each
/// loop, `sampled_rounds` those of sampled tracing; `attach_only` skips the deep dive and the
/// sentinel.
pub fn run(
    out: Option<PathBuf>,
    rounds: usize,
    sampled_rounds: usize,
    attach_only: bool,
) -> Result<()> {
    let bin = stallscope_bin();
    if !bin.exists() {
        bail!(
            "{} is missing: cargo build --release -p probe-user -p cupti-agent",
            bin.display()
        );
    }
    let python = std::env::var("STALLSCOPE_GPU_PYTHON").unwrap_or_else(|_| "python3".into());
    // STALLSCOPE_GPU_CHECK_DEVICE=cpu runs the loop on the CPU: a try of the check's own
    // harness on a machine without a GPU (the GPU figures are then absent).
    let on_cpu = std::env::var("STALLSCOPE_GPU_CHECK_DEVICE").is_ok_and(|d| d == "cpu");
    let ok = Command::new(&python)
        .args([
            "-c",
            "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)",
        ])
        .status()
        .with_context(|| format!("cannot run {python}"))?;
    if !ok.success() && !on_cpu {
        bail!("no CUDA GPU with PyTorch for {python}: gpu-check runs on a GPU machine (STALLSCOPE_GPU_PYTHON picks the interpreter)");
    }
    let out_dir = out.unwrap_or_else(|| root().join("target/gpu-check"));
    std::fs::create_dir_all(&out_dir)?;
    let mut report = json!({"env": phase("env", || Ok(env(&python, &bin)))});
    let script = root().join("tests/targets/gpu_decode.py");
    // The launch-bound loop: the GPU plane's cost where API calls are densest, and a deep dive.
    let start = |kind: &str, warm_s: u64| -> Result<(DecodeLoop, PathBuf)> {
        let target = DecodeLoop::start(&python, &script, kind)?;
        eprintln!("gpu-check: {kind} loop (pid {}) warming up", target.pid);
        std::thread::sleep(Duration::from_secs(warm_s));
        let dir = out_dir.join(kind);
        std::fs::create_dir_all(&dir)?;
        Ok((target, dir))
    };
    {
        let (mut target, dir) = start("llama", 10)?;
        let mut r = json!({"workload": target.kind});
        r["attach"] = phase("attach", || attach::run(&bin, &mut target, &dir, rounds));
        r["sampled"] = phase("sampled", || {
            sampled::run(&bin, &mut target, sampled_rounds)
        });
        if !attach_only {
            r["deep_dive_cli"] = phase("deep-dive", || deep_dive(&bin, &target, &dir));
        }
        r["alive_at_end"] = json!(target.alive());
        report["llama"] = r;
        // Kept as the check goes, in case it is cut short.
        std::fs::write(out_dir.join("report.json"), report.to_string())?;
    }
    // The GPU-bound loop: the GPU plane's cost, the sentinel and the GPU injectors.
    let (mut target, dir) = start("gemv", 5)?;
    report["workload"] = json!(target.kind);
    report["attach"] = phase("attach", || attach::run(&bin, &mut target, &dir, rounds));
    report["sampled"] = phase("sampled", || {
        sampled::run(&bin, &mut target, sampled_rounds)
    });
    if !attach_only {
        let state = out_dir.join("sentinel");
        std::fs::create_dir_all(&state)?;
        report["sentinel"] = phase("sentinel", || {
            sentinel::run(&bin, &mut target, &state, &python, !on_cpu)
        });
    }
    report["loop_alive_at_end"] = json!(target.alive());
    report["goals"] = goals(&report);
    drop(target);
    let text = serde_json::to_string_pretty(&report)?;
    std::fs::write(out_dir.join("report.json"), &text)?;
    println!("{text}");
    Ok(())
}
