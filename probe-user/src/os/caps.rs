//! This process's capabilities (capabilities(7)): what each part of stallscope needs when it
//! does not run as root, and which of those it holds.

use std::fs;

/// A capability stallscope uses, by its number in capabilities(7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    pub number: u32,
    pub name: &'static str,
    /// What stallscope does with it.
    pub used_for: &'static str,
}

pub const CAP_CHOWN: Cap = Cap {
    number: 0,
    name: "CAP_CHOWN",
    used_for: "handing the probe ring to engines run by another user",
};
pub const CAP_DAC_READ_SEARCH: Cap = Cap {
    number: 2,
    name: "CAP_DAC_READ_SEARCH",
    used_for:
        "reading the interpreter files of engines run by another user, and tracefs (root-only)",
};
pub const CAP_SYS_PTRACE: Cap = Cap {
    number: 19,
    name: "CAP_SYS_PTRACE",
    used_for:
        "attaching the Python probes to, and reading the memory of, engines run by another user",
};
pub const CAP_SYS_ADMIN: Cap = Cap {
    number: 21,
    name: "CAP_SYS_ADMIN",
    used_for: "eBPF where CAP_BPF and CAP_PERFMON do not exist (kernels before 5.8)",
};
pub const CAP_SYS_NICE: Cap = Cap {
    number: 23,
    name: "CAP_SYS_NICE",
    used_for:
        "the verdicts at SCHED_FIFO ([sentinel] verdict_priority), fits, deep-dive writers, attaches and the HTTP API in a SCHED_DEADLINE reservation of 1 ms per 10 ms, and the probes' lease keeper in one of 100 µs per 100 ms (without it, the normal policy; fits and writers at SCHED_BATCH nice 10)",
};
pub const CAP_PERFMON: Cap = Cap {
    number: 38,
    name: "CAP_PERFMON",
    used_for: "attaching the eBPF tracing programs",
};
pub const CAP_BPF: Cap = Cap {
    number: 39,
    name: "CAP_BPF",
    used_for: "loading the eBPF programs and maps",
};

/// Every capability stallscope uses, in the order `stallscope check` lists them.
pub const USED: [Cap; 7] = [
    CAP_BPF,
    CAP_PERFMON,
    CAP_SYS_PTRACE,
    CAP_CHOWN,
    CAP_DAC_READ_SEARCH,
    CAP_SYS_NICE,
    CAP_SYS_ADMIN,
];

/// A set of capabilities (a `CapEff`-style bitmask).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CapSet(pub u64);

impl CapSet {
    /// This process's effective set, from /proc/self/status (empty when unreadable).
    pub fn effective() -> CapSet {
        CapSet(
            fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|s| {
                    s.lines()
                        .find_map(|l| l.strip_prefix("CapEff:"))
                        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
                })
                .unwrap_or(0),
        )
    }

    pub fn has(self, c: Cap) -> bool {
        self.0 & (1u64 << c.number) != 0
    }

    /// CAP_BPF and CAP_PERFMON, or CAP_SYS_ADMIN: what loading the eBPF probes needs.
    pub fn can_load_bpf(self) -> bool {
        self.has(CAP_SYS_ADMIN) || (self.has(CAP_BPF) && self.has(CAP_PERFMON))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bpf_needs_bpf_and_perfmon_or_sys_admin() {
        let bpf_only = CapSet(1 << 39 | 1 << 38);
        assert!(bpf_only.can_load_bpf());
        assert!(bpf_only.has(CAP_BPF) && !bpf_only.has(CAP_SYS_PTRACE));
        assert!(!CapSet(1 << 39).can_load_bpf());
        assert!(CapSet(1 << 21).can_load_bpf());
        assert!(!CapSet(0).can_load_bpf());
    }
}
