//! Per-thread accounting over a window: the difference of two kernel-plane snapshots,
//! named and ready to print as a table or JSON.

use std::collections::{BTreeMap, HashMap};

use probe_common::{SyscallStats, ThreadStats};
use serde::Serialize;

use crate::{kernel_plane::syscall_names, kernel_plane::Snapshot};

/// One syscall's totals for a thread over the window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SyscallReport {
    /// Completed calls.
    pub count: u64,
    /// Total ns inside the call.
    pub total_ns: u64,
    /// log2 latency histogram: entry `i` counts calls of `[2^i, 2^(i+1))` ns (trailing
    /// empty buckets omitted).
    pub hist_log2_ns: Vec<u64>,
}

/// One thread's accounting over the window.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadReport {
    /// Thread id.
    pub tid: u32,
    /// Thread name.
    pub comm: String,
    /// Time on a CPU.
    pub on_cpu_ns: u64,
    /// Time runnable but waiting for a CPU.
    pub runq_wait_ns: u64,
    /// Time blocked (sleeping, waiting for I/O or a lock).
    pub blocked_ns: u64,
    /// Voluntary context switches.
    pub nvcsw: u64,
    /// Involuntary context switches.
    pub nivcsw: u64,
    /// Bytes returned by sendto/sendmsg.
    pub net_tx_bytes: u64,
    /// Bytes returned by recvfrom/recvmsg.
    pub net_rx_bytes: u64,
    /// The thread exited during the window.
    pub exited: bool,
    /// Per syscall name.
    pub syscalls: BTreeMap<String, SyscallReport>,
}

impl ThreadReport {
    /// Syscalls sorted by total time, longest first.
    pub fn top_syscalls(&self, n: usize) -> Vec<(&str, &SyscallReport)> {
        let mut v: Vec<_> = self.syscalls.iter().map(|(k, v)| (k.as_str(), v)).collect();
        v.sort_by(|a, b| b.1.total_ns.cmp(&a.1.total_ns).then(a.0.cmp(b.0)));
        v.truncate(n);
        v
    }
}

/// The threads of `pid` between snapshots `a` and `b`. Threads that appear only in `b`
/// count from zero. `comm` names a thread (live name, or the one captured at exit).
pub fn window(
    pid: u32,
    a: &Snapshot,
    b: &Snapshot,
    mut comm: impl FnMut(u32, &ThreadStats) -> String,
) -> Vec<ThreadReport> {
    let zero = ThreadStats::default();
    let mut out: Vec<ThreadReport> = b
        .threads
        .iter()
        .filter(|(_, s)| s.tgid == pid)
        .map(|(&tid, end)| {
            let start = a.threads.get(&tid).unwrap_or(&zero);
            ThreadReport {
                tid,
                comm: comm(tid, end),
                on_cpu_ns: end.on_cpu_ns.saturating_sub(start.on_cpu_ns),
                runq_wait_ns: end.runq_wait_ns.saturating_sub(start.runq_wait_ns),
                blocked_ns: end.blocked_ns.saturating_sub(start.blocked_ns),
                nvcsw: end.nvcsw.saturating_sub(start.nvcsw),
                nivcsw: end.nivcsw.saturating_sub(start.nivcsw),
                net_tx_bytes: end.net_tx_bytes.saturating_sub(start.net_tx_bytes),
                net_rx_bytes: end.net_rx_bytes.saturating_sub(start.net_rx_bytes),
                exited: end.exited != 0,
                syscalls: syscall_window(tid, &a.syscalls, &b.syscalls),
            }
        })
        .collect();
    out.sort_by_key(|t| t.tid);
    out
}

fn syscall_window(
    tid: u32,
    a: &HashMap<(u32, u32), SyscallStats>,
    b: &HashMap<(u32, u32), SyscallStats>,
) -> BTreeMap<String, SyscallReport> {
    let zero = SyscallStats::default();
    b.iter()
        .filter(|((t, _), _)| *t == tid)
        .filter_map(|(key, end)| {
            let start = a.get(key).unwrap_or(&zero);
            let count = end.count.saturating_sub(start.count);
            if count == 0 {
                return None;
            }
            let mut hist: Vec<u64> = end
                .hist
                .iter()
                .zip(start.hist.iter())
                .map(|(e, s)| e.saturating_sub(*s))
                .collect();
            while hist.last() == Some(&0) {
                hist.pop();
            }
            let report = SyscallReport {
                count,
                total_ns: end.total_ns.saturating_sub(start.total_ns),
                hist_log2_ns: hist,
            };
            Some((syscall_names::name(key.1), report))
        })
        .collect()
}

/// A NUL-padded kernel `comm` as a string.
pub fn comm_from_bytes(raw: &[u8]) -> String {
    let end = raw.iter().position(|b| *b == 0).unwrap_or(raw.len());
    String::from_utf8_lossy(&raw[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn snap(entries: &[(u32, u32, u64, u64)], calls: &[(u32, u32, u64, u64)]) -> Snapshot {
        let mut s = Snapshot::default();
        for &(tid, tgid, on_cpu, runq) in entries {
            let t = ThreadStats {
                tgid,
                on_cpu_ns: on_cpu,
                runq_wait_ns: runq,
                ..Default::default()
            };
            s.threads.insert(tid, t);
        }
        for &(tid, nr, count, total) in calls {
            let mut st = SyscallStats {
                count,
                total_ns: total,
                ..Default::default()
            };
            st.hist[probe_common::hist_bucket(total / count.max(1))] = count;
            s.syscalls.insert((tid, nr), st);
        }
        s
    }

    #[test]
    fn window_subtracts_and_filters_by_process() {
        let a = snap(&[(10, 10, 100, 5), (11, 10, 0, 0)], &[(10, 0, 2, 200)]);
        let b = snap(
            &[
                (10, 10, 1100, 15),
                (11, 10, 50, 7),
                (12, 10, 9, 1),
                (99, 99, 1, 1),
            ],
            &[(10, 0, 5, 800), (10, 1, 1, 10)],
        );
        let w = window(10, &a, &b, |tid, _| format!("t{tid}"));
        assert_eq!(
            w.iter().map(|t| t.tid).collect::<Vec<_>>(),
            vec![10, 11, 12]
        );
        assert_eq!((w[0].on_cpu_ns, w[0].runq_wait_ns), (1000, 10));
        assert_eq!(w[0].syscalls["read"].count, 3);
        assert_eq!(w[0].syscalls["read"].total_ns, 600);
        assert_eq!(w[0].syscalls["write"].count, 1);
        assert_eq!(
            w[2].on_cpu_ns, 9,
            "a thread born in the window counts from zero"
        );
        assert_eq!(w[0].top_syscalls(1)[0].0, "read");
    }

    #[test]
    fn comm_stops_at_nul() {
        assert_eq!(comm_from_bytes(b"worker\0\0\0"), "worker");
    }
}
