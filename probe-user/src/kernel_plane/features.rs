//! Detection of the kernel features and privileges the kernel plane needs, with a precise
//! message for each one that is missing.

use std::{fmt, fs, path::PathBuf};

use aya::programs::ProgramType;

/// Where to look for the kernel's BTF and tracefs (overridable for containers and tests).
#[derive(Clone, Debug)]
pub struct KernelPaths {
    /// Kernel BTF blob (default `/sys/kernel/btf/vmlinux`).
    pub btf: PathBuf,
    /// tracefs mount point (default `/sys/kernel/tracing`).
    pub tracefs: PathBuf,
}

impl Default for KernelPaths {
    fn default() -> Self {
        Self {
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            tracefs: PathBuf::from("/sys/kernel/tracing"),
        }
    }
}

/// Linux capability numbers used here (see capabilities(7)).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

/// Tracepoints (tracefs `events/` paths) the probes attach to.
const TRACEPOINTS: [&str; 6] = [
    "sched/sched_switch",
    "sched/sched_wakeup",
    "sched/sched_wakeup_new",
    "sched/sched_process_exit",
    "raw_syscalls/sys_enter",
    "raw_syscalls/sys_exit",
];

/// What the running kernel and process offer.
#[derive(Debug, Clone)]
pub struct Features {
    /// Paths that were checked.
    pub paths: KernelPaths,
    /// Effective capability bitmask of this process.
    pub cap_eff: u64,
    /// Kernel BTF is readable.
    pub btf: bool,
    /// tracefs is mounted and lists the needed tracepoints; otherwise the first one missing.
    pub tracefs: Result<(), String>,
    /// BPF_PROG_TYPE_RAW_TRACEPOINT loads. (Whether tp_btf programs load is only known
    /// by loading them: the loader tries them first and falls back to raw tracepoints.)
    pub raw_tracepoint: bool,
}

/// A missing requirement, rendered as "what is missing: how to fix it".
#[derive(Debug)]
pub struct Missing(pub Vec<String>);

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "the kernel plane cannot start:")?;
        for m in &self.0 {
            write!(f, "\n  - {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Missing {}

impl Features {
    /// Probes the kernel. Program-type probes are skipped without privileges (they would fail).
    pub fn detect(paths: &KernelPaths) -> Self {
        let cap_eff = effective_caps();
        let privileged = has_bpf_privileges(cap_eff);
        let btf = fs::File::open(&paths.btf).is_ok();
        let tracefs = check_tracefs(paths);
        let raw_tracepoint = privileged
            && aya::sys::is_program_supported(ProgramType::RawTracePoint).unwrap_or(false);
        Self {
            paths: paths.clone(),
            cap_eff,
            btf,
            tracefs,
            raw_tracepoint,
        }
    }

    /// Ok when the kernel plane can load; otherwise every missing piece with its fix.
    pub fn require(&self) -> Result<(), Missing> {
        let mut missing = Vec::new();
        if !has_bpf_privileges(self.cap_eff) {
            missing.push(
                "missing privileges: loading eBPF probes needs CAP_BPF and CAP_PERFMON \
                 (or CAP_SYS_ADMIN); run stallscope as root, or grant them with \
                 `setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep /path/to/stallscope`"
                    .to_string(),
            );
        }
        if !self.btf {
            missing.push(format!(
                "missing kernel BTF: {} is not readable; stallscope needs a kernel built with \
                 CONFIG_DEBUG_INFO_BTF=y (or pass --btf PATH to a BTF file for this kernel)",
                self.paths.btf.display()
            ));
        }
        if let Err(e) = &self.tracefs {
            missing.push(e.clone());
        }
        if has_bpf_privileges(self.cap_eff) && !self.raw_tracepoint {
            missing.push(
                "the kernel refuses raw_tracepoint programs (needs CONFIG_BPF_EVENTS=y and \
                 no lockdown of BPF)"
                    .to_string(),
            );
        }
        if missing.is_empty() {
            Ok(())
        } else {
            Err(Missing(missing))
        }
    }

    /// One line per feature, for `stallscope check`.
    pub fn describe(&self) -> Vec<(String, bool, String)> {
        vec![
            (
                "privileges (CAP_BPF+CAP_PERFMON)".into(),
                has_bpf_privileges(self.cap_eff),
                format!("CapEff={:#x}", self.cap_eff),
            ),
            (
                "kernel BTF".into(),
                self.btf,
                self.paths.btf.display().to_string(),
            ),
            (
                "tracefs".into(),
                self.tracefs.is_ok(),
                match &self.tracefs {
                    Ok(()) => self.paths.tracefs.display().to_string(),
                    Err(e) => e.clone(),
                },
            ),
            (
                "raw_tracepoint programs".into(),
                self.raw_tracepoint,
                String::new(),
            ),
        ]
    }
}

/// CAP_BPF+CAP_PERFMON, or CAP_SYS_ADMIN, in the effective set.
fn has_bpf_privileges(cap_eff: u64) -> bool {
    let has = |c: u32| cap_eff & (1u64 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
}

/// The effective capability set from /proc/self/status (0 when unreadable).
fn effective_caps() -> u64 {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .unwrap_or(0)
}

fn check_tracefs(paths: &KernelPaths) -> Result<(), String> {
    let root = &paths.tracefs;
    if !root.join("events").is_dir() {
        return Err(format!(
            "tracefs is not mounted at {}: mount it with `mount -t tracefs none {}` \
             (`cargo xtask setup` does), or pass --tracefs PATH",
            root.display(),
            root.display()
        ));
    }
    for tp in TRACEPOINTS {
        if !root.join("events").join(tp).is_dir() {
            return Err(format!(
                "tracepoint {tp} is not offered by this kernel ({} has no events/{tp})",
                root.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn privileges_need_bpf_and_perfmon_or_sys_admin() {
        assert!(!has_bpf_privileges(0));
        assert!(!has_bpf_privileges(1 << CAP_BPF));
        assert!(has_bpf_privileges(1 << CAP_BPF | 1 << CAP_PERFMON));
        assert!(has_bpf_privileges(1 << CAP_SYS_ADMIN));
    }

    #[test]
    fn missing_tracefs_names_the_path_and_the_fix() {
        let paths = KernelPaths {
            btf: "/nonexistent/btf".into(),
            tracefs: "/nonexistent/tracefs".into(),
        };
        let err = check_tracefs(&paths).unwrap_err();
        assert!(
            err.contains("/nonexistent/tracefs") && err.contains("mount -t tracefs"),
            "{err}"
        );
    }
}
