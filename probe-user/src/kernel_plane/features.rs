//! Detection of the kernel features and privileges the kernel plane needs, with a precise
//! message for each one that is missing.

use std::{fmt, fs, path::PathBuf};

use aya::programs::ProgramType;

use crate::os::caps::{CapSet, CAP_BPF, CAP_PERFMON, USED};

/// Where to look for the kernel's BTF and tracefs (overridable for containers and tests), and
/// which program type hooks the tracepoints.
#[derive(Clone, Debug)]
pub struct KernelPaths {
    /// Kernel BTF blob (default `/sys/kernel/btf/vmlinux`).
    pub btf: PathBuf,
    /// tracefs mount point (default `/sys/kernel/tracing`).
    pub tracefs: PathBuf,
    /// The hooks' program type.
    pub hooks: Hooks,
}

impl Default for KernelPaths {
    fn default() -> Self {
        Self {
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            tracefs: PathBuf::from("/sys/kernel/tracing"),
            hooks: Hooks::Auto,
        }
    }
}

/// Which program type attaches to the tracepoints.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Hooks {
    /// tp_btf where the kernel takes it, each refused one falling back to raw_tracepoint.
    #[default]
    Auto,
    /// raw_tracepoint for every hook (kernels whose tp_btf attach is broken; and the
    /// fallback's own test).
    RawTracepoint,
}

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
    /// This process's effective capabilities.
    pub caps: CapSet,
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
        let caps = CapSet::effective();
        let privileged = caps.can_load_bpf();
        let btf = fs::File::open(&paths.btf).is_ok();
        let tracefs = check_tracefs(paths);
        let raw_tracepoint = privileged
            && aya::sys::is_program_supported(ProgramType::RawTracePoint).unwrap_or(false);
        Self {
            paths: paths.clone(),
            caps,
            btf,
            tracefs,
            raw_tracepoint,
        }
    }

    /// Ok when the kernel plane can load; otherwise every missing piece with its fix.
    pub fn require(&self) -> Result<(), Missing> {
        let mut missing = Vec::new();
        if !self.caps.can_load_bpf() {
            let lacking: Vec<&str> = [CAP_BPF, CAP_PERFMON]
                .iter()
                .filter(|c| !self.caps.has(**c))
                .map(|c| c.name)
                .collect();
            missing.push(format!(
                "missing privileges ({}): loading eBPF probes needs CAP_BPF and CAP_PERFMON \
                 (or CAP_SYS_ADMIN); run stallscope as root, or grant them (with the \
                 Python plane's): `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_chown,cap_dac_read_search+ep /path/to/stallscope`",
                lacking.join(" and ")
            ));
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
        if self.caps.can_load_bpf() && !self.raw_tracepoint {
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

    /// One line per feature, for `stallscope check`: what, `ok`/`MISSING` (or, for a
    /// capability only some uses need, `held`/`absent`), and the detail.
    pub fn describe(&self) -> Vec<(String, &'static str, String)> {
        let status = |ok: bool| if ok { "ok" } else { "MISSING" };
        let mut rows = vec![(
            "eBPF privileges".into(),
            status(self.caps.can_load_bpf()),
            "CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN".to_string(),
        )];
        // Which capabilities are needed depends on the kernel and on whose engines
        // stallscope attaches to: each is listed with what it is for.
        for c in USED {
            rows.push((
                format!("  {}", c.name),
                if self.caps.has(c) { "held" } else { "absent" },
                c.used_for.to_string(),
            ));
        }
        rows.extend([
            (
                "kernel BTF".into(),
                status(self.btf),
                self.paths.btf.display().to_string(),
            ),
            (
                "tracefs".into(),
                status(self.tracefs.is_ok()),
                match &self.tracefs {
                    Ok(()) => self.paths.tracefs.display().to_string(),
                    Err(e) => e.clone(),
                },
            ),
            (
                "raw_tracepoint programs".into(),
                status(self.raw_tracepoint),
                String::new(),
            ),
            (
                "PID namespace".into(),
                "ok",
                match crate::os::pidns::own_unless_host() {
                    Ok(None) => "the host's: engines are watched by the kernel's ids".to_string(),
                    Ok(Some(ns)) => format!(
                        "its own (inode {}, e.g. a sidecar): engines in it are watched by its ids, whose kernel ids the probes learn as the engines' threads run",
                        ns.ino
                    ),
                    Err(e) => format!("unknown: /proc/self/ns/pid: {e}"),
                },
            ),
        ]);
        rows
    }
}

fn check_tracefs(paths: &KernelPaths) -> Result<(), String> {
    let root = &paths.tracefs;
    if let Err(e) = fs::read_dir(root) {
        if e.kind() == std::io::ErrorKind::PermissionDenied {
            return Err(format!(
                "tracefs at {} is not readable by this user: checking the tracepoints needs CAP_DAC_READ_SEARCH (or root)",
                root.display()
            ));
        }
    }
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
    fn missing_tracefs_names_the_path_and_the_fix() {
        let paths = KernelPaths {
            btf: "/nonexistent/btf".into(),
            tracefs: "/nonexistent/tracefs".into(),
            hooks: Hooks::Auto,
        };
        let err = check_tracefs(&paths).unwrap_err();
        assert!(
            err.contains("/nonexistent/tracefs") && err.contains("mount -t tracefs"),
            "{err}"
        );
    }
}
