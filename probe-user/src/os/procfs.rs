//! Small readers for /proc: processes, their threads, names and states.

use std::{fs, path::PathBuf};

/// `/proc/PID`.
fn proc_dir(pid: u32) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}"))
}

/// Whether a process with this pid exists and has a live thread. Its leader shows as a
/// zombie as soon as it ends, while its other threads may still run (after exit_group they
/// are still exiting: their exit is not accounted yet; after pthread_exit they run on).
pub fn process_exists(pid: u32) -> bool {
    let live = |tid| thread_state(pid, tid).is_some_and(|s| s != 'Z' && s != 'X');
    live(pid) || (thread_state(pid, pid).is_some() && threads(pid).into_iter().any(live))
}

/// Checks that `pid` names a live process other than stallscope itself (the target of a
/// probe or a deep dive); the error says how to find the right pid.
pub fn require_target(pid: u32) -> anyhow::Result<()> {
    if pid == 0 || !process_exists(pid) {
        anyhow::bail!("no such process: pid {pid} does not exist (check it with `ps -p {pid}`)");
    }
    if pid == std::process::id() {
        anyhow::bail!("pid {pid} is stallscope itself; give the pid of the process to watch");
    }
    Ok(())
}

/// The thread ids of `pid` right now (empty if it is gone).
pub fn threads(pid: u32) -> Vec<u32> {
    let Ok(dir) = fs::read_dir(proc_dir(pid).join("task")) else {
        return Vec::new();
    };
    let mut tids: Vec<u32> = dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    tids.sort_unstable();
    tids
}

/// The thread's name (`comm`), if it still exists.
pub fn thread_comm(pid: u32, tid: u32) -> Option<String> {
    let s = fs::read_to_string(proc_dir(pid).join(format!("task/{tid}/comm"))).ok()?;
    Some(s.trim_end_matches('\n').to_string())
}

/// The process's command line, arguments joined by spaces.
pub fn cmdline(pid: u32) -> Option<String> {
    let raw = fs::read(proc_dir(pid).join("cmdline")).ok()?;
    let parts: Vec<String> = raw
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    Some(parts.join(" "))
}

/// The one-letter scheduler state of a thread (`R`, `S`, `D`, ...), from `stat`.
pub fn thread_state(pid: u32, tid: u32) -> Option<char> {
    let stat = fs::read_to_string(proc_dir(pid).join(format!("task/{tid}/stat"))).ok()?;
    // The comm field may contain spaces and parentheses: the state follows the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().next()?.chars().next()
}

/// The parent pid, from `stat`.
pub fn parent(pid: u32) -> Option<u32> {
    let stat = fs::read_to_string(proc_dir(pid).join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// All pids currently in /proc.
pub fn all_pids() -> Vec<u32> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The target and its descendants.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let all: Vec<(u32, Option<u32>)> = all_pids().into_iter().map(|p| (p, parent(p))).collect();
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let parent = tree[i];
        tree.extend(
            all.iter()
                .filter(|(_, pp)| *pp == Some(parent))
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    tree
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_process() {
        let me = std::process::id();
        // SAFETY: no arguments.
        let tid = unsafe { libc::gettid() } as u32;
        assert!(process_exists(me));
        assert!(threads(me).contains(&tid));
        assert_eq!(thread_state(me, tid), Some('R'), "this thread is running");
        assert!(!process_exists(u32::MAX - 1));
    }
}
