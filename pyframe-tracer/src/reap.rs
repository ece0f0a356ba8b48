//! Removes probe ring files (and copies of the compiled writer, [`crate::native`]) that nothing
//! can use any more. A ring file lives in the target's
//! `/dev/shm` (or `/tmp`) only while an attach is in flight: the session unlinks it once both
//! sides have it mapped. A daemon killed mid-attach leaves it behind (8-33 MB of RAM each).
//! The attaching process holds the file's `flock` from before it has its name
//! ([`Ring::create`](crate::ring::Ring::create)), and the kernel drops the lock when that
//! process dies: a ring file whose lock is free is left over, whatever its age. Every daemon
//! reaps its own namespace's at start-up, and every attach reaps its target's first.

use std::path::{Path, PathBuf};

use sys_util::lock::held;

/// Where ring files go, in the target's own mount namespace, in order of preference.
pub const RING_DIRS: [&str; 2] = ["/dev/shm", "/tmp"];

/// The target pid in the name of a ring file (`stallscope-ring-<pid>-<nonce>`) or of a copy of
/// the compiled writer (`stallscope-pyprobe-<pid>-<nonce>.so`).
pub fn ring_pid(name: &str) -> Option<i32> {
    let rest = name.strip_prefix("stallscope-ring-").or_else(|| {
        name.strip_prefix(crate::native::COPY_PREFIX)?
            .strip_suffix(".so")
    })?;
    let (pid, nonce) = rest.split_once('-')?;
    (!nonce.is_empty() && nonce.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| pid.parse().ok())
        .flatten()
}

/// Removes, from `dir`, the ring files no live attach holds; the removed paths.
pub fn orphans(dir: &Path) -> Vec<PathBuf> {
    reap(dir, |_, path| !held(path))
}

/// Removes the ring files of `pid` in its own `/dev/shm` and `/tmp` (through `/proc/PID/root`)
/// that no live attach holds; the removed paths.
pub fn stale_of(pid: i32) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in RING_DIRS {
        out.extend(reap(
            Path::new(&format!("/proc/{pid}/root{dir}")),
            |p, path| p == pid && !held(path),
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
            (stale(pid, &path) && sys_util::lock::remove(&path).is_ok()).then_some(path)
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
            ("stallscope-pyprobe-1234-1a2b.so", Some(1234)),
            ("stallscope-pyprobe-1234-1a2b", None),
            ("stallscope-gpu-1234", None),
            ("other", None),
        ] {
            assert_eq!(ring_pid(name), pid, "{name}");
        }
    }

    #[test]
    fn only_rings_no_attach_holds_go() {
        let dir = std::env::temp_dir().join(format!("stallscope-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let me = std::process::id();
        let held = dir.join(format!("stallscope-ring-{me}-1"));
        let ring = crate::ring::Ring::create(&held, 2, 1).unwrap();
        let files = [
            format!("stallscope-ring-{me}-2"),
            "stallscope-ring-4194305-1".to_string(),
            "unrelated-4194305".to_string(),
        ];
        for f in &files {
            std::fs::write(dir.join(f), b"x").unwrap();
        }
        let mut gone = orphans(&dir);
        gone.sort();
        let mut expected = vec![dir.join(&files[0]), dir.join(&files[1])];
        expected.sort();
        assert_eq!(gone, expected);
        assert!(held.exists() && dir.join(&files[2]).exists());
        drop(ring);
        assert_eq!(orphans(&dir), vec![held]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
