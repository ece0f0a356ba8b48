//! A CPU quota on an engine (cgroup v1 `cpu` controller or cgroup v2 `cpu.max`), always
//! undone. An engine in a container is throttled in its own cgroup, as its pod's limit would
//! (moving it out would leave its pod's limits and accounting); the quota it had is put back
//! afterwards. Any other engine's process tree is moved into a temporary cgroup, and back.

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use anyhow::{bail, Context, Result};

/// The CFS bandwidth period's bounds (`cpu.cfs_period_us`, `cpu.max`): 1 ms to 1 s.
const PERIOD_US: std::ops::RangeInclusive<u64> = 1_000..=1_000_000;
/// The smallest quota the kernel takes, µs.
const MIN_QUOTA_US: u64 = 1_000;

/// A quota in force; [`CpuQuota::undo`] (or drop) restores the original cgroups.
pub struct CpuQuota {
    dir: PathBuf,
    /// The CFS period set, µs.
    period_us: u64,
    /// Where each moved task came from: (tid or pid, original cgroup directory).
    moved: Vec<(u32, PathBuf)>,
    /// In a container's own cgroup: each quota file and the value it had.
    saved: Vec<(PathBuf, String)>,
    v2: bool,
    done: bool,
}

/// The mount point of cgroup v1's `cpu` controller, or of the cgroup v2 hierarchy.
fn hierarchy() -> Result<(PathBuf, bool)> {
    use sys_util::cgroup;
    match (cgroup::v1_root("cpu"), cgroup::v2_root()) {
        (Some(v1), _) => Ok((v1, false)),
        (None, Some(v2)) => Ok((v2, true)),
        (None, None) => {
            bail!("no cgroup cpu controller is mounted: mount cgroup v2 or the v1 cpu controller")
        }
    }
}

/// `tid`'s cgroup path in the hierarchy (v1: the line listing `cpu`; v2: the `0::` line).
fn cgroup_of(pid: u32, tid: u32, v2: bool) -> Option<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/cgroup")).ok()?;
    text.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, ctrl, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = if v2 {
            ctrl.is_empty()
        } else {
            ctrl.split(',').any(|c| c == "cpu")
        };
        hit.then(|| path.to_string())
    })
}

fn tasks(dir: &Path, v2: bool) -> PathBuf {
    dir.join(if v2 { "cgroup.procs" } else { "tasks" })
}

impl CpuQuota {
    fn new(dir: PathBuf, period_us: u64, v2: bool) -> CpuQuota {
        CpuQuota {
            dir,
            period_us,
            moved: Vec::new(),
            saved: Vec::new(),
            v2,
            done: false,
        }
    }

    /// Moves `pid` and its descendants (every thread on v1, every process on v2) into a new
    /// cgroup limited to `cpus` CPUs' worth of time in every `period`. The period is held to
    /// 1 ms..1 s, and lengthened where `cpus` of it would be under the kernel's smallest
    /// quota (1 ms), so the share holds ([`CpuQuota::period`] is the one set).
    pub fn apply(pid: u32, cpus: f64, period: Duration) -> Result<CpuQuota> {
        let (root, v2) = hierarchy()?;
        // Rounded, not raised: 1 ms over 0.1 CPUs is 10,000.000000000002 µs in floating point
        // (the quota is held to 1 ms below).
        let period = ((period.as_micros() as f64)
            .max(MIN_QUOTA_US as f64 / cpus)
            .round() as u64)
            .clamp(*PERIOD_US.start(), *PERIOD_US.end());
        let quota = ((cpus * period as f64) as u64).max(MIN_QUOTA_US);
        if let Some(own) =
            cgroup_of(pid, pid, v2).filter(|c| pod_identity::cgroup::from_path(c).is_some())
        {
            return Self::in_place(root.join(own.trim_start_matches('/')), quota, period, v2);
        }
        let dir = root.join(format!("stallscope-inject-{pid}"));
        if dir.exists() {
            bail!(
                "{} exists: another injection into pid {pid} is running (or one was killed; remove it with rmdir)",
                dir.display()
            );
        }
        if v2 {
            let _ = std::fs::write(root.join("cgroup.subtree_control"), "+cpu");
        }
        std::fs::create_dir(&dir)
            .with_context(|| format!("cannot create {} (needs root)", dir.display()))?;
        let mut q = CpuQuota::new(dir, period, v2);
        let set = if v2 {
            std::fs::write(q.dir.join("cpu.max"), format!("{quota} {period}"))
        } else {
            std::fs::write(q.dir.join("cpu.cfs_period_us"), period.to_string())
                .and_then(|()| std::fs::write(q.dir.join("cpu.cfs_quota_us"), quota.to_string()))
        };
        set.with_context(|| format!("setting the CPU quota in {}", q.dir.display()))?;
        for p in crate::process_tree(pid) {
            let members: Vec<u32> = if v2 {
                vec![p]
            } else {
                std::fs::read_dir(format!("/proc/{p}/task"))
                    .map(|d| {
                        d.flatten()
                            .filter_map(|e| e.file_name().to_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default()
            };
            for t in members {
                let Some(orig) = cgroup_of(p, t, v2) else {
                    continue;
                };
                if std::fs::write(tasks(&q.dir, v2), t.to_string()).is_ok() {
                    q.moved.push((t, root.join(orig.trim_start_matches('/'))));
                }
            }
        }
        if q.moved.is_empty() {
            bail!(
                "could not move any task of pid {pid} into {}",
                q.dir.display()
            );
        }
        Ok(q)
    }

    /// Sets the quota on a container's own cgroup `dir`, keeping the values it replaces.
    ///
    /// On v1 the quota is written before the period, and restored after it: the limit only
    /// falls in between (the new quota over the old period, the old period over the new
    /// quota), and a child's limit may not exceed its parent's (the pod's), which a limit
    /// that rose on the way could.
    fn in_place(dir: PathBuf, quota: u64, period: u64, v2: bool) -> Result<CpuQuota> {
        let files: Vec<(&str, String)> = if v2 {
            vec![("cpu.max", format!("{quota} {period}"))]
        } else {
            vec![
                ("cpu.cfs_quota_us", quota.to_string()),
                ("cpu.cfs_period_us", period.to_string()),
            ]
        };
        let mut q = CpuQuota::new(dir, period, v2);
        for (name, value) in files {
            let file = q.dir.join(name);
            let old = std::fs::read_to_string(&file)
                .with_context(|| format!("reading {} (needs root)", file.display()))?;
            std::fs::write(&file, &value)
                .with_context(|| format!("setting the CPU quota in {}", file.display()))?;
            q.saved.push((file, old.trim().to_string()));
        }
        Ok(q)
    }

    /// The CFS period the quota is enforced over.
    pub fn period(&self) -> Duration {
        Duration::from_micros(self.period_us)
    }

    /// Where the quota is, for reports.
    pub fn describe(&self) -> String {
        if !self.saved.is_empty() {
            return format!("{} (the container's own cgroup)", self.dir.display());
        }
        format!(
            "{} ({} {} moved)",
            self.dir.display(),
            self.moved.len(),
            if self.v2 { "processes" } else { "threads" }
        )
    }

    /// Moves every task back where it came from (threads created meanwhile go where their
    /// process's first task came from) and removes the cgroup.
    pub fn undo(mut self) -> Result<()> {
        self.restore()
    }

    fn restore(&mut self) -> Result<()> {
        if self.done {
            return Ok(());
        }
        self.done = true;
        if !self.saved.is_empty() {
            // In the reverse order of `in_place`'s writes: the period first, then the quota.
            let mut failed = Vec::new();
            for (file, old) in self.saved.iter().rev() {
                if std::fs::write(file, old).is_err() {
                    failed.push(file.display().to_string());
                }
            }
            if !failed.is_empty() {
                bail!(
                    "could not restore {}: write the old values back",
                    failed.join(", ")
                );
            }
            return Ok(());
        }
        let fallback = self.moved.first().map(|m| m.1.clone());
        let inside: Vec<u32> = std::fs::read_to_string(tasks(&self.dir, self.v2))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| l.trim().parse().ok())
            .collect();
        for t in inside {
            let back = self
                .moved
                .iter()
                .find(|m| m.0 == t)
                .map(|m| m.1.clone())
                .or_else(|| fallback.clone());
            if let Some(b) = back {
                let _ = std::fs::write(tasks(&b, self.v2), t.to_string());
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return Ok(());
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        bail!(
            "could not remove {}: tasks are still in it (move them out and rmdir it)",
            self.dir.display()
        )
    }
}

impl Drop for CpuQuota {
    fn drop(&mut self) {
        let _ = self.restore();
    }
}
