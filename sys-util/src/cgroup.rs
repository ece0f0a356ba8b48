//! Where this host mounts its cgroup hierarchies (`/proc/self/mounts`): the v2 hierarchy, and
//! on a hybrid host the v1 controllers beside it.

use std::path::PathBuf;

/// (mount point, file-system type, options) of each cgroup mount.
fn mounts() -> Vec<(PathBuf, String, String)> {
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let (point, kind, options) = (f.get(1)?, f.get(2)?, f.get(3)?);
            kind.starts_with("cgroup")
                .then(|| (PathBuf::from(point), kind.to_string(), options.to_string()))
        })
        .collect()
}

/// The mount point of the cgroup v2 hierarchy (`/sys/fs/cgroup` on a v2 host, a subfolder
/// on a hybrid one).
pub fn v2_root() -> Option<PathBuf> {
    mounts()
        .into_iter()
        .find(|(_, kind, _)| kind == "cgroup2")
        .map(|(point, ..)| point)
}

/// The mount point of cgroup v1's `controller` (e.g. `cpu`), where the host has one.
pub fn v1_root(controller: &str) -> Option<PathBuf> {
    mounts()
        .into_iter()
        .find(|(_, kind, options)| kind == "cgroup" && options.split(',').any(|o| o == controller))
        .map(|(point, ..)| point)
}

/// Whether v1 hierarchies are mounted beside the v2 one (hybrid mode).
pub fn hybrid() -> bool {
    let m = mounts();
    m.iter().any(|(_, kind, _)| kind == "cgroup") && m.iter().any(|(_, kind, _)| kind == "cgroup2")
}
