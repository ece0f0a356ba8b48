//! Removes probe ring files that nothing can use any more. A ring file lives in the target's
//! `/dev/shm` (or `/tmp`) only while an attach is in flight: the session unlinks it once both
//! sides have it mapped. A daemon killed mid-attach, or stopped while an attach to a stuck
//! target waited, leaves it behind (8-33 MB of RAM each), so every daemon reaps at start-up,
//! and every attach reaps its target's leftovers first.

use std::{
    path::{Path, PathBuf},
    time::{Duration, SystemTime},
};

/// Where ring files go, in the target's own mount namespace, in order of preference.
pub const RING_DIRS: [&str; 2] = ["/dev/shm", "/tmp"];

/// A file of an attach still in flight is younger than this (an attach gives up well before).
pub const IN_FLIGHT: Duration = Duration::from_secs(120);

/// The target pid in a ring file's name (`stallscope-ring-<pid>-<nonce>`).
pub fn ring_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("stallscope-ring-")?;
    let (pid, nonce) = rest.split_once('-')?;
    (!nonce.is_empty() && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

fn older_than(path: &Path, age: Duration) -> bool {
    std::fs::metadata(path)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|a| a >= age)
}

/// Removes, from `dir`, the ring files of processes that no longer exist; the removed paths.
pub fn dead_targets(dir: &Path) -> Vec<PathBuf> {
    reap(dir, |pid, _| !Path::new(&format!("/proc/{pid}")).exists())
}

/// Removes the ring files of `pid` in its own `/dev/shm` and `/tmp` (through `/proc/PID/root`)
/// that it has not mapped and that are older than [`IN_FLIGHT`]; the removed paths.
pub fn stale_of(pid: i32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut out = Vec::new();
    for dir in RING_DIRS {
        out.extend(reap(
            Path::new(&format!("/proc/{pid}/root{dir}")),
            |p, path| {
                let inside = format!(
                    "{dir}/{}",
                    path.file_name().unwrap_or_default().to_string_lossy()
                );
                p == pid && !maps.contains(&inside) && older_than(path, IN_FLIGHT)
            },
        ));
    }
    out
}

fn reap(dir: &Path, stale: impl Fn(i32, &Path) -> bool) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let path = e.path();
            let pid = ring_pid(&e.file_name().to_string_lossy())?;
            (stale(pid, &path) && std::fs::remove_file(&path).is_ok()).then_some(path)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_names_carry_their_target() {
        for (name, pid) in [
            ("stallscope-ring-1234-1a2b", Some(1234)),
            ("stallscope-ring-7-0", Some(7)),
            ("stallscope-ring-1234-", None),
            ("stallscope-ring-x-1a", None),
            ("stallscope-ring-12-zz", None),
            ("stallscope-gpu-1234", None),
            ("other", None),
        ] {
            assert_eq!(ring_pid(name), pid, "{name}");
        }
    }

    #[test]
    fn only_rings_of_dead_targets_go() {
        let dir = std::env::temp_dir().join(format!("stallscope-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        // A pid above the kernel's limit (4194304) never exists.
        let files = [
            format!("stallscope-ring-{me}-1"),
            "stallscope-ring-4194305-1".to_string(),
            "unrelated-4194305".to_string(),
        ];
        for f in &files {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let gone = dead_targets(&dir);
        assert_eq!(gone, vec![dir.join(&files[1])]);
        assert!(dir.join(&files[0]).exists() && dir.join(&files[2]).exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
