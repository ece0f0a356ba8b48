//! Developer tasks: `cargo xtask setup | run | test | bench | vllm`.
//!
//! Everything that a fresh machine lacks is installed here, idempotently; caches live
//! outside the checkout (`$STALLSCOPE_CACHE`, default `~/.cache/stallscope`).

mod bench;
mod bench_batch_queue;
mod bench_deep_dive;
mod bench_folds;
mod bench_memory;
mod bench_overhead;
mod bench_python;
mod bench_sentinel;
mod bench_trace;
mod fuzz;
mod gpu_check;
mod image;
mod leaks;
mod portable_agent;
mod setup;
mod sglang;
mod vllm;
mod vllm_size;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "xtask", about = "stallscope developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what is missing (eBPF toolchain, bpf-linker, tracefs, packages) and build
    /// target/release/stallscope.
    Setup,
    /// Set up if needed, then start the daemon (`stallscope run`) on its embedded default
    /// configuration. Extra arguments go to `stallscope run`.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up if needed, then run every check and test (fmt, clippy, unit and end-to-end, a
    /// bounded fuzz run of every decoder).
    Test,
    /// Run the benchmarks and print a Markdown report (see BENCHMARKS.md).
    Bench {
        /// Only this part: `kernel`, `python`, `python-unwatched` (the unwatched calls alone,
        /// part of `python`), `sentinel`, `overhead` (over an hour), `memory` (an hour),
        /// `trace`, `deep-dive`, `batch-queue` or `fuzz` (default: all; the sentinel's vLLM
        /// part, `overhead`, `memory` and `deep-dive` need `cargo xtask vllm up` first,
        /// `batch-queue` `cargo xtask vllm up --pipeline-parallel 2`, and each is skipped
        /// without its server).
        #[arg(long, value_parser = ["kernel", "python", "python-unwatched", "sentinel", "overhead", "memory", "trace", "deep-dive", "batch-queue", "fuzz"])]
        only: Option<String>,
        /// Seconds per fuzz target in the `fuzz` part.
        #[arg(long, default_value_t = 1800)]
        fuzz_seconds: u64,
    },
    /// Fuzz the decoders of outside bytes (shared-memory ring and agent channel, CUPTI
    /// records, model files, CSV tables, /proc text, vLLM's log, watch specs, the
    /// configuration, HTTP requests) with cargo-fuzz on the pinned nightly; fails on a crash.
    Fuzz {
        /// Seconds per target.
        #[arg(long, default_value_t = 60)]
        seconds: u64,
        /// libFuzzer processes per target (`-fork`).
        #[arg(long, default_value_t = 1)]
        jobs: usize,
        /// Only these targets (default: all).
        targets: Vec<String>,
    },
    /// The GPU plane on a real GPU (needs a driver and PyTorch; uses the built binaries):
    /// counts, correlation join rate, clock alignment, throughput cost, traces.
    GpuCheck {
        /// Where the report, traces and the daemon's state go (default target/gpu-check).
        #[arg(long)]
        out: Option<std::path::PathBuf>,
        /// A/B rounds (detached, then attached) on each loop.
        #[arg(long, default_value_t = 4)]
        rounds: usize,
        /// Rounds of sampled tracing (detached, then `stallscope gpu --sample 1s/3s`) on
        /// each loop.
        #[arg(long, default_value_t = 3)]
        sampled_rounds: usize,
        /// Only the A/B rounds (no deep dive, no sentinel).
        #[arg(long)]
        attach_only: bool,
    },
    /// Build the daemon's container image (deploy/Containerfile) offline with buildah, from
    /// the release binary, the GPU agent builds and the libraries the binary loads.
    Image {
        /// Image name and tag.
        #[arg(long, default_value = concat!("stallscope:", env!("CARGO_PKG_VERSION")))]
        tag: String,
        /// Then start a container of it (crun) and ask it for its version and configuration.
        #[arg(long)]
        check: bool,
    },
    /// A real vLLM CPU server on loopback, the end-to-end target: `up`, `load`, `down`.
    Vllm {
        #[command(subcommand)]
        cmd: vllm::Vllm,
    },
}

fn main() -> Result<()> {
    match Cli::parse().task {
        Task::Setup => setup::run(),
        Task::Run { args } => {
            setup::run()?;
            run_checked(Command::new(stallscope_bin()).arg("run").args(args))
        }
        Task::Test => {
            setup::run()?;
            cargo(&["fmt", "--all", "--check"])?;
            cargo(&["fmt", "--manifest-path", "fuzz/Cargo.toml", "--check"])?;
            // The workspace's default members: every crate but probe-ebpf, which only builds
            // for bpfel-unknown-none (probe-user/build.rs compiles it, warnings included).
            cargo(&[
                "clippy",
                "--all-targets",
                "--release",
                "--",
                "-D",
                "warnings",
            ])?;
            unit_and_end_to_end_tests()?;
            // A bounded run over every decoder (the long runs are `bench --only fuzz`).
            fuzz::run(CI_FUZZ_SECONDS, 1, &[])?;
            vllm_end_to_end()
        }
        Task::Fuzz {
            seconds,
            jobs,
            targets,
        } => {
            setup::run()?;
            fuzz::run(seconds, jobs, &targets).map(drop)
        }
        Task::Bench { only, fuzz_seconds } => {
            setup::run()?;
            // Speeds differ several-fold between CPUs of one machine kind: every report says
            // which one it measured.
            println!(
                "Measured on: {} ({})\n",
                vllm_size::Cpu::read()?.describe(),
                String::from_utf8_lossy(&Command::new("uname").arg("-r").output()?.stdout).trim()
            );
            let part = |p: &str| only.as_deref().is_none_or(|o| o == p);
            if part("kernel") {
                bench::run()?;
            }
            if part("python") {
                bench_python::run()?;
            }
            if only.as_deref() == Some("python-unwatched") {
                bench_python::unwatched_alone()?;
            }
            if part("sentinel") {
                bench_sentinel::run()?;
            }
            if part("overhead") {
                bench_overhead::run()?;
            }
            if part("memory") {
                bench_memory::run()?;
            }
            if part("batch-queue") {
                bench_batch_queue::run()?;
            }
            if part("trace") {
                bench_trace::run()?;
            }
            if part("deep-dive") {
                bench_deep_dive::run()?;
            }
            if part("fuzz") {
                let jobs = std::thread::available_parallelism().map_or(1, usize::from);
                println!("## Fuzzing ({fuzz_seconds} s per target, {jobs} processes)\n");
                println!("| target | executions | seconds | crashes |\n|---|---|---|---|");
                for o in fuzz::run(fuzz_seconds, jobs, &[])? {
                    println!("| {} | {} | {:.0} | 0 |", o.target, o.runs, o.seconds);
                }
            }
            Ok(())
        }
        Task::GpuCheck {
            out,
            rounds,
            sampled_rounds,
            attach_only,
        } => gpu_check::run(out, rounds, sampled_rounds, attach_only),
        Task::Image { tag, check } => image::build(&tag, check),
        Task::Vllm { cmd } => vllm::run(cmd),
    }
}

/// The workspace's tests: unit and doc tests, then each integration test binary on its own,
/// with a count of the daemon's shared-memory files before and after it (a leak fails it).
fn unit_and_end_to_end_tests() -> Result<()> {
    cargo(&[
        "test",
        "--release",
        "--lib",
        "--bins",
        "--",
        "--test-threads=1",
    ])?;
    cargo(&["test", "--release", "--doc"])?;
    for (package, test) in integration_tests()? {
        let before = leaks::snapshot();
        cargo(&[
            "test",
            "--release",
            "--package",
            &package,
            "--test",
            &test,
            "--",
            "--test-threads=1",
        ])?;
        leaks::check(&before, &format!("test binary {test}"))?;
    }
    Ok(())
}

/// `(package, test target)` of every integration test of the default members (those that
/// need a vLLM server skip, or run without it, here; [`vllm_end_to_end`] runs them with it).
fn integration_tests() -> Result<Vec<(String, String)>> {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--no-deps", "--format-version", "1"])
        .current_dir(root())
        .output()?;
    if !out.status.success() {
        bail!(
            "cargo metadata failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let members: Vec<&str> = meta["workspace_default_members"]
        .as_array()
        .context("cargo metadata without workspace_default_members")?
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    let mut tests = Vec::new();
    for p in meta["packages"].as_array().into_iter().flatten() {
        if !members.contains(&p["id"].as_str().unwrap_or_default()) {
            continue;
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let is_test = t["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|k| k == "test"));
            let name = t["name"].as_str().unwrap_or_default();
            if is_test {
                tests.push((
                    p["name"].as_str().unwrap_or_default().to_string(),
                    name.to_string(),
                ));
            }
        }
    }
    Ok(tests)
}

/// The tests that need a vLLM server, by the pipeline-parallel size of the server each needs,
/// in the order [`vllm_end_to_end`] runs them.
const VLLM_TESTS: [(u32, &[&str]); 2] = [
    (1, &["sentinel_vllm", "fleet", "attach_cycles_vllm"]),
    (2, &["batch_queue_vllm"]),
];

/// Seconds each fuzz target runs in `cargo xtask test`.
const CI_FUZZ_SECONDS: u64 = 15;

/// The tests that need a real vLLM server: the sentinel's end-to-end test
/// (tests/sentinel_vllm.rs, about 15 minutes), the serving group with vLLM as one of its
/// nodes (tests/fleet.rs) and 20 attach/detach cycles under load (tests/attach_cycles_vllm.rs)
/// against one bring-up in a pod (`--isolated`, as a DaemonSet finds engines); then the batch-queue loop (tests/batch_queue_vllm.rs, a few minutes) against a
/// second, pipelined one. Runs each test with its server's JSON in STALLSCOPE_VLLM, and stops
/// each server whatever the outcome. Then SGLang's scheduler (tests/sglang_scheduler.rs),
/// which runs on the vLLM venv's torch.
fn vllm_end_to_end() -> Result<()> {
    let mut model_dir = String::new();
    for &(pipeline_parallel, tests) in &VLLM_TESTS {
        let server = vllm::up(8000, None, None, pipeline_parallel == 1, pipeline_parallel)?;
        let result = tests
            .iter()
            .try_for_each(|test| vllm_test(test, &server, &[]));
        let down = vllm::down();
        result.and(down)?;
        let server: serde_json::Value = serde_json::from_str(&server)?;
        model_dir = server["model_dir"].as_str().unwrap_or_default().to_string();
    }
    let site = sglang::ensure_site()?;
    test_binary(
        "sglang_scheduler",
        &[
            ("STALLSCOPE_SGLANG_SITE", &site.to_string_lossy()),
            ("STALLSCOPE_SGLANG_MODEL", &model_dir),
        ],
    )
}

/// Runs test binary `test` against the vLLM server whose JSON is `server`, with `env` too.
pub fn vllm_test(test: &str, server: &str, env: &[(&str, &str)]) -> Result<()> {
    let mut env = env.to_vec();
    env.push(("STALLSCOPE_VLLM", server));
    test_binary(test, &env)
}

/// Runs test binary `test` with `env`, and checks that it leaves nothing behind.
fn test_binary(test: &str, env: &[(&str, &str)]) -> Result<()> {
    let before = leaks::snapshot();
    run_checked(
        Command::new(env!("CARGO"))
            .args(["test", "--release", "--test", test, "--", "--nocapture"])
            .current_dir(root())
            .env("STALLSCOPE_BIN", stallscope_bin())
            .env("STALLSCOPE_XTASK", root().join("target/release/xtask"))
            .envs(env.iter().copied()),
    )?;
    leaks::check(&before, &format!("test binary {test}"))
}

/// A bench's count from the environment variable `name`, `default` when it is unset; a value
/// that is not a whole number of at least 2 is refused, naming the variable and `what` it counts.
pub fn env_count(name: &str, default: usize, what: &str) -> Result<usize> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(s) => s
            .parse()
            .ok()
            .filter(|&n| n >= 2)
            .with_context(|| format!("{name}: {s:?} is not a number of {what} (2 or more)")),
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    let built = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace");
    // A prebuilt xtask carried to another machine (gpu-check) runs from the checkout's root.
    match std::env::current_dir() {
        Ok(cwd) if !built.exists() && cwd.join("xtask/Cargo.toml").exists() => cwd,
        _ => built.to_path_buf(),
    }
}

/// The release `stallscope` binary.
pub fn stallscope_bin() -> PathBuf {
    root().join("target/release/stallscope")
}

/// Runs cargo in the workspace root with the stallscope binary exported to tests.
pub fn cargo(args: &[&str]) -> Result<()> {
    run_checked(
        Command::new(env!("CARGO"))
            .args(args)
            .current_dir(root())
            .env("STALLSCOPE_BIN", stallscope_bin()),
    )
}

/// Runs a command to completion; an error if it cannot start or exits non-zero.
pub fn run_checked(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed ({status})");
    }
    Ok(())
}
