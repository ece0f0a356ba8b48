//! Shared-memory files a test binary's daemons and engines leave behind. A probe ring, a GPU
//! channel or a copy of a library given to an engine must not outlive both its daemon and its
//! engine; once a test binary has ended, every daemon and engine it started is gone, so any
//! such file it created is a leak.

use std::{collections::BTreeSet, path::PathBuf};

use anyhow::{bail, Result};

/// Where the daemon puts rings, channels and agent copies, and their name prefixes.
const PLACES: [(&str, &[&str]); 2] = [
    ("/dev/shm", &["stallscope-"]),
    (
        "/tmp",
        &["stallscope-ring-", "stallscope-gpu-", "stallscope-pyprobe-"],
    ),
];

/// The daemon's shared-memory files present now.
pub fn snapshot() -> BTreeSet<PathBuf> {
    PLACES
        .iter()
        .flat_map(|(dir, prefixes)| {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
                .filter(|e| {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    prefixes.iter().any(|p| name.starts_with(p))
                })
                .map(|e| e.path())
        })
        .collect()
}

/// Fails, naming them, when files appeared since `before` and are still there after `what`.
pub fn check(before: &BTreeSet<PathBuf>, what: &str) -> Result<()> {
    let left: Vec<String> = snapshot()
        .difference(before)
        .map(|p| {
            let size = std::fs::metadata(p).map_or(0, |m| m.len());
            format!("{} ({size} bytes)", p.display())
        })
        .collect();
    if !left.is_empty() {
        bail!(
            "{what} left {} shared-memory file(s) behind after its daemons and engines ended:\n  {}",
            left.len(),
            left.join("\n  ")
        );
    }
    Ok(())
}
