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
    /// The cgroups made for it, in every hierarchy, each after its children.
    pub cgroups: Vec<PathBuf>,
}

impl Pod {
    /// Makes the cgroups of a pod whose host is `name` (ids from the clock and this process)
    /// in the v2 hierarchy. With `cpu_controller`, on a host whose `cpu` controller is v1's
    /// (hybrid), in that hierarchy too, as a kubelet would, for tools that act on the
    /// container's CPU cgroup. Its groups keep the default weight there: unlike a kubelet's,
    /// which weights pods by their requests, the whole pod then competes for CPU as one task
    /// against each process outside it.
    pub fn create(name: &str, cpu_controller: bool) -> io::Result<Pod> {
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
        let path = [
            "kubepods.slice".to_string(),
            "kubepods-burstable.slice".to_string(),
            format!("kubepods-burstable-pod{}.slice", uid.replace('-', "_")),
            format!("{CONTAINER_PREFIX}{container_id}.scope"),
        ];
        let mut roots = vec![crate::cgroup::v2_root().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "no cgroup v2 hierarchy is mounted: a pod needs one for its cgroup",
            )
        })?];
        if cpu_controller {
            roots.extend(crate::cgroup::v1_root("cpu"));
        }
        let mut cgroups = Vec::new();
        for root in roots {
            let mut dir = root;
            for s in &path {
                // The cpu controller down to the container, where the hierarchy offers it
                // (cgroup v2; on a hybrid host it is v1's and this write fails, harmlessly).
                let _ = fs::write(dir.join("cgroup.subtree_control"), "+cpu");
                dir = dir.join(s);
                if !dir.exists() {
                    fs::create_dir(&dir).map_err(|e| {
                        io::Error::new(e.kind(), format!("creating {}: {e}", dir.display()))
                    })?;
                    cgroups.insert(0, dir.clone());
                }
            }
        }
        Ok(Pod {
            name: name.to_string(),
            uid,
            container_id,
            cgroups,
        })
    }

    /// The container's cgroup in each hierarchy (v2 last).
    pub fn container_cgroups(&self) -> impl Iterator<Item = &PathBuf> {
        self.cgroups.iter().filter(|c| {
            c.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(CONTAINER_PREFIX))
        })
    }

    /// The container's cgroup in the v2 hierarchy.
    pub fn container_cgroup(&self) -> &Path {
        self.container_cgroups()
            .last()
            .expect("a pod has a container cgroup")
    }

    /// The program and arguments that run the arguments that follow them in the pod.
    pub fn prefix(&self) -> Vec<String> {
        let join: Vec<String> = self
            .container_cgroups()
            .map(|c| format!("echo $$ > {} && ", c.join("cgroup.procs").display()))
            .collect();
        let inside = format!(
            "{}mount -t tmpfs pod-shm /dev/shm && mount -t tmpfs pod-tmp /tmp && hostname {} && exec \"$@\"",
            join.concat(),
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

/// The container scope's prefix (containerd's, with the systemd driver).
const CONTAINER_PREFIX: &str = "cri-containerd-";
