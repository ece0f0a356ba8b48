//! Which host resource a ranked event stands for: the syscall classes (waits on another
//! thread, storage, memory management) and the telemetry series behind each event.

use model::root_cause::{EventKey, EventKind};

/// Syscalls in which a thread waits for another thread or process (locks, condition
/// variables, spin-and-yield hand-offs, waits for a descriptor to become ready). Their time
/// grows with whatever delays the other side: vLLM's engine core spends each step in futex and
/// sched_yield waiting for its worker, and past its spin in poll on the worker's socket, so
/// when memory pressure or a hog slows the worker they grow most and would name the symptom,
/// not the cause (the cause shows in the other side's states). Like interruptible sleep they
/// are left out of the ranking (the trace still shows them); reads and writes stay in.
pub const WAIT_SYSCALLS: [&str; 9] = [
    "futex",
    "sched_yield",
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
];

/// Syscalls that wait on storage.
const IO_SYSCALLS: [&str; 14] = [
    "read",
    "write",
    "pread64",
    "pwrite64",
    "readv",
    "writev",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "openat",
    "close",
    "io_uring_enter",
    "io_getevents",
    "sync",
];
/// Syscalls that manage memory.
const MEMORY_SYSCALLS: [&str; 6] = ["mmap", "munmap", "brk", "madvise", "mprotect", "mremap"];

/// The telemetry series an event depends on.
pub fn resources(e: &EventKey) -> Vec<String> {
    let v: &[&str] = match e.kind {
        EventKind::ThreadState
            if e.name.starts_with("running") || e.name.starts_with("runnable") =>
        {
            &["psi.cpu.some", "cpu.util"]
        }
        EventKind::ThreadState if e.name.starts_with("blocked") => &[
            "psi.memory.some",
            "psi.memory.full",
            "psi.io.some",
            "psi.io.full",
            "vm.pgmajfault",
        ],
        EventKind::Syscall if IO_SYSCALLS.contains(&e.name.as_str()) => {
            &["psi.io.some", "psi.io.full"]
        }
        EventKind::Syscall if MEMORY_SYSCALLS.contains(&e.name.as_str()) => {
            &["psi.memory.some", "psi.memory.full"]
        }
        _ => &[],
    };
    v.iter().map(|s| s.to_string()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernel_plane::syscall_names;

    #[test]
    fn the_wait_syscalls_left_out_are_syscalls_of_this_host() {
        let known: Vec<String> = (0..512).map(syscall_names::name).collect();
        for w in WAIT_SYSCALLS {
            assert!(
                known.iter().any(|k| k == w),
                "{w} is not a syscall name here"
            );
        }
    }
}
