//! The SGLang profile on SGLang's own scheduler: `tools/sglang_scheduler.py` runs the real
//! `Scheduler` of the SGLang wheel `cargo xtask test` installs (its process, title, sockets,
//! caches, batches and both event loops) with a stand-in model worker, on a CPU: no SGLang
//! server can run here (its CUDA build needs a GPU; its CPU engine needs `sgl_kernel`'s CPU
//! build, which is not on PyPI). The daemon finds the scheduler by its process title, picks
//! the SGLang profile, and its iterations are held against the stand-in worker's record of
//! every forward it was asked for: one iteration per batch, its size, its stage and (for
//! prefills) its KV context, in order, for `event_loop_normal` and `event_loop_overlap`.
//!
//! `cargo xtask test` runs this file with STALLSCOPE_SGLANG_SITE (the directory with the
//! SGLang wheel and the modules it imports, for PYTHONPATH) and STALLSCOPE_SGLANG_MODEL (the
//! model directory of its vLLM server: config and tokenizer) after its vLLM tests, whose venv
//! (torch) it reuses. Without them the test says so and does nothing.

use std::{
    io::{BufRead, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;

mod common;
use common::daemon::{default_config, Daemon};
use common::vllm::{parse_export, Row};
use common::{cache_dir, free_port, require_root, tmpdir, Proc};

/// The stand-in forward's length: every iteration contains one.
const FORWARD_MS: f64 = 5.0;

/// SGLang's ForwardMode values (checked in each release by tests/profiles.rs).
const EXTEND: u64 = 1;
const DECODE: u64 = 2;

/// One forward the stand-in worker was asked for: (mode, batch, seq_lens_sum).
fn truth(path: &Path) -> Vec<(u64, u64, u64)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| {
            let v: Vec<u64> = l.split(' ').map(|x| x.parse().unwrap()).collect();
            (v[0], v[1], v[2])
        })
        .collect()
}

/// The driver's next protocol line starting with `word` (SGLang's own log lines between are
/// kept for the message should the driver end first).
fn expect(out: &mut impl BufRead, word: &str) -> String {
    let mut seen = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("the SGLang driver ended before saying {word:?}:\n{seen}");
        }
        if line.starts_with(word) {
            return line.trim().to_string();
        }
        seen.push_str(&line);
    }
}

#[test]
fn sglang_scheduler_iterations_match_its_batches_in_both_loops() {
    let Some(site) = std::env::var_os("STALLSCOPE_SGLANG_SITE") else {
        eprintln!("SKIP: STALLSCOPE_SGLANG_SITE is not set; `cargo xtask test` installs SGLang and runs this test");
        return;
    };
    require_root();
    let python = cache_dir().join("vllm-venv/bin/python");
    // A model directory of `vllm up` (its config and tokenizer; no weights are read).
    let model = PathBuf::from(std::env::var_os("STALLSCOPE_SGLANG_MODEL").unwrap_or_default());
    assert!(
        python.exists() && model.join("config.json").exists(),
        "the vLLM venv or STALLSCOPE_SGLANG_MODEL's model is missing ({}, {model:?}): run `cargo xtask vllm up` once and name its model_dir",
        python.display(),
    );
    let driver = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/sglang_scheduler.py");
    for (lp, overlap) in [("event_loop_normal", false), ("event_loop_overlap", true)] {
        let dir = tmpdir(&format!("sglang-{lp}"));
        let [go, start, stop, truth_path] = ["go", "start", "stop", "truth"].map(|f| dir.join(f));
        let mut cmd = Command::new(&python);
        cmd.env("PYTHONPATH", &site)
            .args(["-W", "ignore"])
            .arg(&driver)
            .arg("--model")
            .arg(&model)
            .arg("--truth")
            .arg(&truth_path)
            .arg("--go")
            .arg(&go)
            .arg("--start")
            .arg(&start)
            .arg("--stop")
            .arg(&stop)
            .args(["--forward-ms", &FORWARD_MS.to_string()])
            .args(overlap.then_some("--overlap"))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("driver.err")).unwrap());
        let mut sglang = Proc::spawn(&mut cmd);
        let mut out = BufReader::new(sglang.child().stdout.take().unwrap());
        let scheduler: u32 = expect(&mut out, "scheduler ")[10..].parse().unwrap();
        let title = std::fs::read_to_string(format!("/proc/{scheduler}/cmdline")).unwrap();
        assert!(title.starts_with("sglang::scheduler_DP0"), "{title:?}");

        let port = free_port();
        let csv = dir.join("iterations.csv");
        let mut daemon = Daemon::start_with(&dir, port, default_config(&dir, port, &[]));
        // Found by its title among the host's processes, attached while the driver nudges it.
        daemon.wait_for("attached SGLang scheduler", Duration::from_secs(120), |d| {
            d.engine()
                .is_some_and(|e| e["pid"] == scheduler && e["anchor"].is_string())
        });
        let engine: Value = daemon.engine().unwrap();
        assert_eq!(engine["framework"], "sglang", "{engine}");
        // Its data-parallel rank, from the title.
        assert_eq!(engine["rank"], "DP0", "{engine}");
        assert_eq!(
            engine["anchor"], "sglang.srt.managers.scheduler:Scheduler.run_batch.__wrapped__",
            "{engine}"
        );
        std::fs::write(&go, "").unwrap();
        expect(&mut out, "quiet");
        let (truth_from, rows_from) = (truth(&truth_path).len(), parse_export(&csv).len());
        std::fs::write(&start, "").unwrap();
        expect(&mut out, "done");
        std::thread::sleep(Duration::from_secs(1));
        let want = truth(&truth_path).split_off(truth_from);
        // The daemon flushes its export with its accounting ([report] interval, 1 s, and up to
        // 250 ms more once no iteration ends): wait for the rows of the batches asked, up to
        // three intervals, then compare whatever is there.
        let until = Instant::now() + Duration::from_secs(3);
        while parse_export(&csv).len() - rows_from < want.len() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(100));
        }
        let got: Vec<Row> = parse_export(&csv).split_off(rows_from);
        let decode = want.iter().filter(|w| w.0 == DECODE).count();
        println!(
            "{lp}: {} batches asked of the worker ({decode} decode), {} iterations exported; shortest {:.1} ms (the forward {FORWARD_MS} ms)",
            want.len(),
            got.len(),
            got.iter().map(|r| r.duration_ms).fold(f64::INFINITY, f64::min)
        );
        assert!(
            decode > 10 && want.len() > decode,
            "{lp}: the load should mix prefills and decodes: {want:?}"
        );
        assert_eq!(got.len(), want.len(), "{lp}\ndaemon log:\n{}", daemon.log());
        for (i, (r, w)) in got.iter().zip(&want).enumerate() {
            let row = format!("{lp}: iteration {i}: {r:?} for batch {w:?}");
            assert_eq!(r.batch, w.1, "{row}");
            assert_eq!(
                (r.prefill, r.decode),
                (w.0 == EXTEND, w.0 == DECODE),
                "{row}"
            );
            // A decode batch's KV context comes from ModelRunner.forward's ForwardBatch, which
            // the stand-in worker does not run.
            if w.0 == EXTEND {
                assert!(
                    (r.context - w.2 as f64).abs() < 0.01 * r.batch as f64,
                    "{row}"
                );
            }
            // The iteration holds the forward it launched.
            assert!(r.duration_ms >= FORWARD_MS, "{row}");
        }

        std::fs::write(&stop, "").unwrap();
        let status = sglang.child().wait().unwrap();
        assert!(
            status.success(),
            "{lp}: the SGLang driver failed ({status}): {}",
            std::fs::read_to_string(dir.join("driver.err")).unwrap_or_default()
        );
        assert!(daemon.stop().success(), "{}", daemon.log());
    }
}
