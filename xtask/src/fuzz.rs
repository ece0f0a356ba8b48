//! `cargo xtask fuzz`: the decoders of bytes the daemon does not control, fuzzed with
//! cargo-fuzz (libFuzzer, AddressSanitizer) on the pinned nightly.
//!
//! The targets are built into the cache (`fuzz/target`), outside the checkout, so a fresh
//! clone rebuilds only what changed. Each target (`fuzz/fuzz_targets/`) runs for a bounded
//! time over three corpora: the working corpus in the cache (grown run after run), the
//! hand-made seeds and
//! the regression inputs of past crashes (`fuzz/seeds/<target>`, `fuzz/regressions/<target>`,
//! committed). A crash fails the run and names the input libFuzzer kept.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context, Result};

use crate::{root, run_checked, setup::cache_dir};

/// cargo-fuzz, installed into the cache.
const CARGO_FUZZ_VERSION: &str = "0.13.2";
/// The rustup toolchain `cargo xtask setup` links to the pinned nightly (sanitizers need it).
const NIGHTLY: &str = "stallscope-ebpf";

/// The fuzz targets, each a decoder of outside bytes.
pub const TARGETS: [&str; 10] = [
    "ring",
    "agent_channel",
    "cupti_records",
    "model_file",
    "csv_table",
    "proc_maps",
    "engine_log",
    "watch_spec",
    "config",
    "http",
];

/// One target's run.
pub struct Outcome {
    pub target: &'static str,
    pub runs: u64,
    pub seconds: f64,
}

/// Builds every target, then runs each named one (all when `only` is empty) for `seconds`
/// with `jobs` processes. Fails at the first crash.
pub fn run(seconds: u64, jobs: usize, only: &[String]) -> Result<Vec<Outcome>> {
    let cargo_fuzz = install()?;
    let fuzz_dir = root().join("fuzz");
    // In the cache, so that a fresh clone rebuilds only what changed.
    let target_dir = cache_dir().join("fuzz/target");
    eprintln!("fuzz: building the targets (cargo-fuzz, AddressSanitizer)");
    run_checked(
        Command::new(&cargo_fuzz)
            .args(["fuzz", "build", "-O", "--target-dir"])
            .arg(&target_dir)
            .current_dir(&fuzz_dir)
            .env("RUSTUP_TOOLCHAIN", NIGHTLY),
    )?;
    let bins = target_dir.join("x86_64-unknown-linux-gnu/release");
    let mut outcomes = Vec::new();
    for target in TARGETS {
        if !only.is_empty() && !only.iter().any(|o| o == target) {
            continue;
        }
        outcomes.push(run_target(&bins, &fuzz_dir, target, seconds, jobs)?);
    }
    if outcomes.is_empty() {
        bail!("no fuzz target named {only:?}: the targets are {TARGETS:?}");
    }
    Ok(outcomes)
}

fn run_target(
    bins: &Path,
    fuzz_dir: &Path,
    target: &'static str,
    seconds: u64,
    jobs: usize,
) -> Result<Outcome> {
    let corpus = cache_dir().join("fuzz/corpus").join(target);
    let artifacts = cache_dir().join("fuzz/artifacts").join(target);
    std::fs::create_dir_all(&corpus)?;
    std::fs::create_dir_all(&artifacts)?;
    let mut cmd = Command::new(bins.join(target));
    cmd.arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg(format!("-max_total_time={seconds}"))
        .arg("-timeout=10")
        .arg("-rss_limit_mb=2048")
        .arg(&corpus);
    for extra in ["seeds", "regressions"] {
        let dir = fuzz_dir.join(extra).join(target);
        if dir.is_dir() {
            cmd.arg(dir);
        }
    }
    if jobs > 1 {
        // -fork runs the target in child processes and survives nothing: the first crash
        // still stops it (-ignore_crashes=0).
        cmd.arg(format!("-fork={jobs}"));
    }
    let start = Instant::now();
    let out = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .with_context(|| format!("running fuzz target {target}"))?;
    let log = String::from_utf8_lossy(&out.stderr);
    let seconds = start.elapsed().as_secs_f64();
    if !out.status.success() {
        let tail: Vec<&str> = log.lines().rev().take(40).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        bail!(
            "fuzz target {target} crashed ({}):\n{}\nthe input is in {}: fix the decoder, then copy it into fuzz/regressions/{target}/ so every run replays it",
            out.status,
            tail.join("\n"),
            artifacts.display()
        );
    }
    let runs = executions(&log);
    eprintln!("fuzz: {target}: {runs} executions in {seconds:.0} s, no crash");
    Ok(Outcome {
        target,
        runs,
        seconds,
    })
}

/// Executions libFuzzer reports: `Done N runs` (one process), or the last `#N` status line
/// of a `-fork` run.
fn executions(log: &str) -> u64 {
    let done = log.lines().find_map(|l| {
        l.strip_prefix("Done ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    });
    done.unwrap_or_else(|| {
        log.lines()
            .rev()
            .find_map(|l| {
                l.strip_prefix('#')?
                    .split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            })
            .unwrap_or(0)
    })
}

/// cargo-fuzz in the cache, installed when missing or another version.
fn install() -> Result<PathBuf> {
    let root = cache_dir().join("cargo-fuzz");
    let bin = root.join("bin/cargo-fuzz");
    let version = Command::new(&bin).arg("--version").output();
    if version.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(CARGO_FUZZ_VERSION)) {
        return Ok(bin);
    }
    eprintln!("setup: installing cargo-fuzz {CARGO_FUZZ_VERSION} (about a minute)");
    run_checked(
        Command::new(env!("CARGO"))
            .args(["install", "cargo-fuzz", "--version", CARGO_FUZZ_VERSION])
            .args(["--locked", "--root"])
            .arg(&root)
            .env_remove("RUSTUP_TOOLCHAIN")
            .current_dir("/"),
    )?;
    Ok(bin)
}

#[cfg(test)]
mod tests {
    use super::executions;

    #[test]
    fn executions_are_read_from_either_log_form() {
        assert_eq!(
            executions("#1000\tpulse\nDone 4242 runs in 5 second(s)\n"),
            4242
        );
        assert_eq!(
            executions("#5000: cov: 10 ft: 20 corp: 3 exec/s: 100\n#9000: cov: 11 ft: 21\n"),
            9000
        );
        assert_eq!(executions("nothing\n"), 0);
    }
}
