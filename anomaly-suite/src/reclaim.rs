//! Reclaim aimed at one engine: its processes' file-backed pages paged out on demand.

use std::time::Instant;

/// Reclaim aimed at the engine's processes: their file-backed pages (code of the interpreter
/// and its extension libraries, mapped model files) are paged out with
/// `process_madvise(MADV_PAGEOUT)`, as the kernel's reclaim does to a cgroup pushed past
/// memory.high when there is no swap (anonymous pages stay). The engine faults them back in
/// from disk. Used where the kernel's own reclaim cannot be aimed at the engine (cgroup v1
/// hosts have no memory.high), and by the I/O scenario, whose refaults then wait on the busy
/// disk.
pub struct Reclaim {
    /// (pid, pidfd) of each engine process.
    targets: Vec<(u32, std::os::fd::OwnedFd)>,
}

impl Reclaim {
    pub fn open(pid: u32) -> Reclaim {
        use std::os::fd::FromRawFd;
        let targets = crate::process_tree(pid)
            .into_iter()
            .filter_map(|p| {
                // SAFETY: pidfd_open takes a pid and flags; the result is checked.
                let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, p as libc::pid_t, 0) };
                // SAFETY: a fresh descriptor owned by nobody else.
                (fd >= 0).then(|| (p, unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as i32) }))
            })
            .collect();
        Reclaim { targets }
    }

    /// The engine's processes it pages out.
    pub fn processes(&self) -> usize {
        self.targets.len()
    }

    /// Pages out every file-backed mapping once (stopping at `deadline`: a pass over a busy
    /// engine can take seconds); returns the bytes the kernel reclaimed (process_madvise's
    /// result) and the first error, if any.
    pub fn pass(&self, deadline: Instant) -> (u64, Option<std::io::Error>) {
        use std::os::fd::AsRawFd;
        let mut done = 0u64;
        let mut error = None;
        for (pid, fd) in &self.targets {
            let iov: Vec<libc::iovec> = pyframe_tracer::maps::read(*pid as i32)
                .unwrap_or_default()
                .into_iter()
                .map(|m| libc::iovec {
                    iov_base: m.start as *mut libc::c_void,
                    iov_len: (m.end - m.start) as usize,
                })
                .collect();
            // UIO_MAXIOV ranges per call.
            for chunk in iov.chunks(1024) {
                if Instant::now() >= deadline {
                    return (done, error);
                }
                // SAFETY: the iovecs describe ranges of the target, never dereferenced here.
                let r = unsafe {
                    libc::syscall(
                        libc::SYS_process_madvise,
                        fd.as_raw_fd(),
                        chunk.as_ptr(),
                        chunk.len(),
                        libc::MADV_PAGEOUT,
                        0,
                    )
                };
                if r >= 0 {
                    done += r as u64;
                } else if error.is_none() {
                    error = Some(std::io::Error::last_os_error());
                }
            }
        }
        (done, error)
    }
}
