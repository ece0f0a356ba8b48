//! A pod made of the kernel's own parts, as a kubelet would run a container: its own PID,
//! mount, IPC and UTS namespaces, private tmpfs on /dev/shm and /tmp, and a kubelet-shaped
//! cgroup on the cgroup v2 hierarchy (`kubepods.slice/kubepods-burstable.slice/
//! kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`). The network is the host's,
//! as with `hostNetwork`. For `cargo xtask vllm up --isolated` and the tests; needs root.

use std::{
    fs, io,
    path::{Path, PathBuf},
    time::{SystemTime, UNIX_EPOCH},
};

/// A pod's identity and the cgroups made for it.
#[derive(Debug, Clone)]
pub struct Pod {
    /// Its host name.
    pub name: String,
    pub uid: String,
    pub container_id: String,
    /// The cgroups made for it, innermost (the container's) first.
    pub cgroups: Vec<PathBuf>,
}

impl Pod {
    /// Makes the cgroups of a pod whose host is `name` (ids from the clock and this process).
    pub fn create(name: &str) -> io::Result<Pod> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos() as u64;
        let seed = nanos ^ u64::from(std::process::id()) << 32;
        let uid = format!(
            "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
            seed as u32,
            (seed >> 32) as u16,
            seed & 0xfff,
            (seed >> 12) & 0xfff,
            seed & 0xffff_ffff_ffff
        );
        let container_id = format!("{seed:016x}").repeat(4);
        let mut dir = cgroup2_root()?;
        let mut cgroups = Vec::new();
        for s in [
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
            format!("cri-containerd-{container_id}.scope"),
        ] {
            dir = dir.join(s);
            if !dir.exists() {
                fs::create_dir(&dir).map_err(|e| {
                    io::Error::new(e.kind(), format!("creating {}: {e}", dir.display()))
                })?;
                cgroups.insert(0, dir.clone());
            }
        }
        Ok(Pod {
            name: name.to_string(),
            uid,
            container_id,
            cgroups,
        })
    }

    /// The container's cgroup.
    pub fn container_cgroup(&self) -> &Path {
        &self.cgroups[0]
    }

    /// The program and arguments that run the arguments that follow them in the pod.
    pub fn prefix(&self) -> Vec<String> {
        let inside = format!(
            "echo $$ > {} && mount -t tmpfs pod-shm /dev/shm && mount -t tmpfs pod-tmp /tmp && hostname {} && exec \"$@\"",
            self.container_cgroup().join("cgroup.procs").display(),
            self.name
        );
        [
            "unshare",
            "--pid",
            "--mount",
            "--ipc",
            "--uts",
            "--fork",
            "--mount-proc",
            "--propagation",
            "private",
            "sh",
            "-c",
            &inside,
            "sh",
        ]
        .map(str::to_string)
        .to_vec()
    }

    /// Whether the pod's private /tmp or /dev/shm hide `path` from its processes.
    pub fn hides(path: &Path) -> bool {
        path.starts_with("/tmp") || path.starts_with("/dev/shm")
    }

    /// Removes the pod's cgroups, waiting up to a second for its processes to be reaped.
    pub fn remove(&self) {
        for c in &self.cgroups {
            for _ in 0..50 {
                if fs::remove_dir(c).is_ok() || !c.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a v2 host, a subfolder on a
/// hybrid one).
pub fn cgroup2_root() -> io::Result<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mounts")?;
    mounts
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            (f.get(2) == Some(&"cgroup2")).then(|| PathBuf::from(f[1]))
        })
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup v2 hierarchy is mounted: a pod needs one for its cgroup",
            )
        })
}
