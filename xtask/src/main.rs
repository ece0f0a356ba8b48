//! Developer tasks: `cargo xtask setup | run | test | bench | vllm`.
//!
//! Everything that a fresh machine lacks is installed here, idempotently; caches live
//! outside the checkout (`$STALLSCOPE_CACHE`, default `~/.cache/stallscope`).

mod bench;
mod bench_python;
mod setup;
mod vllm;

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
    /// Set up if needed, then run every check and test (fmt, clippy, unit and end-to-end).
    Test,
    /// Run the benchmarks and print a Markdown report (see BENCHMARKS.md).
    Bench {
        /// Only this part: `kernel` or `python` (default: both).
        #[arg(long, value_parser = ["kernel", "python"])]
        only: Option<String>,
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
            cargo(&["test", "--release", "--", "--test-threads=1"])
        }
        Task::Bench { only } => {
            setup::run()?;
            if only.as_deref() != Some("python") {
                bench::run()?;
            }
            if only.as_deref() != Some("kernel") {
                bench_python::run()?;
            }
            Ok(())
        }
        Task::Vllm { cmd } => vllm::run(cmd),
    }
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
        .to_path_buf()
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
