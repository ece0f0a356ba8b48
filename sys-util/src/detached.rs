//! Work that finishes even when the process that asked for it is killed.
//!
//! [`run`] forks; the child does the work and hands its result back through a pipe. The child
//! leads its own session, blocks every signal that can be blocked and holds none of the
//! caller's files (its standard ones are /dev/null), so a SIGKILL of the caller, a Ctrl-C in its terminal or a kill of its process
//! group leaves the child to finish and exit on its own. It is made for work that must never be
//! cut short: a ptrace transaction that changed a thread of another process, whose registers only
//! the tracer that changed them can put back (the kernel detaches a dead tracer's tracees as they
//! are, `exit_ptrace` in kernel/ptrace.c).
//!
//! # What the work may do
//! The child is a copy of a possibly multi-threaded caller in which only the calling thread runs
//! (fork(2)): a lock that another thread held at the fork stays held in the child forever. glibc
//! makes malloc usable in the child; the work must take no other lock that another thread may
//! hold (stdout, stderr, a logger).
//!
//! # When the caller stops waiting
//! [`run`] waits at most its `patience` for the result. A child that has not handed it back by
//! then is left to finish (it may be holding another process's thread, which only it can put
//! back) and reaped in the background; the caller gets an error that says what the child was
//! doing (its state, the kernel function it sleeps in, its syscall) and what competes for the
//! host's CPUs, so a wedged child shows in the caller's log instead of hanging the caller with
//! it.
//!
//! # What still stops it
//! SIGKILL of every process of the caller's cgroup (`cgroup.kill`, an OOM kill of the container)
//! and the death of the caller when it is its pid namespace's init (the kernel then kills the
//! whole namespace).

use std::{
    fs::File,
    io::{self, Read, Write},
    os::fd::{AsRawFd, FromRawFd, RawFd},
    panic::{catch_unwind, AssertUnwindSafe},
    time::{Duration, Instant},
};

/// Runs `work` in a child process that outlives this one if it must, and returns what it
/// returned. Fails if the fork fails, the child died before handing its result back, or it has
/// not handed it back within `patience` (the child then goes on alone; see the module's
/// docs).
pub fn run(patience: Duration, work: impl FnOnce() -> Vec<u8>) -> io::Result<Vec<u8>> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2 fills the two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let [read_end, write_end] = fds;
    // SAFETY: the child runs only `work` and async-signal-safe calls, then _exits (the module's
    // rules); the parent owns both pipe ends.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        let e = io::Error::last_os_error();
        // SAFETY: our own descriptors.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        return Err(e);
    }
    if pid == 0 {
        child(write_end, work);
    }
    // SAFETY: our own descriptors; the File owns the read end from here.
    unsafe { libc::close(write_end) };
    let mut out = Vec::new();
    // SAFETY: the read end is ours alone.
    let pipe = unsafe { File::from_raw_fd(read_end) };
    let read = read_within(pipe, &mut out, Instant::now() + patience);
    if let Err(e) = &read {
        if e.kind() == io::ErrorKind::TimedOut {
            let doing = crate::task_state::doing(&format!("/proc/{pid}"));
            let contention = crate::task_state::cpu_contention();
            // The child finishes on its own; only its exit status is left to collect.
            let _ = std::thread::Builder::new()
                .name("detached-reap".into())
                .spawn(move || reap(pid));
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "the helper process {pid} has not handed back its result after {patience:?} (left to finish alone; {doing}{contention})"
                ),
            ));
        }
    }
    let status = reap(pid);
    read?;
    // The child writes its result behind its length: fewer bytes mean it died midway.
    match out.get(..8).map(|n| u64::from_le_bytes(n.try_into().unwrap())) {
        Some(n) if n == (out.len() - 8) as u64 => Ok(out.split_off(8)),
        _ => Err(io::Error::other(format!(
            "the helper process {pid} exited without handing back its result (wait status {status:#x})"
        ))),
    }
}

fn child(write_end: RawFd, work: impl FnOnce() -> Vec<u8>) -> ! {
    // SAFETY: plain syscalls on this process: a new session, every blockable signal blocked,
    // every descriptor but the pipe closed, the standard ones on /dev/null.
    unsafe {
        libc::setsid();
        let mut all: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::sigprocmask(libc::SIG_BLOCK, &all, std::ptr::null_mut());
        libc::syscall(libc::SYS_close_range, 0u32, (write_end - 1) as u32, 0u32);
        libc::syscall(
            libc::SYS_close_range,
            (write_end + 1) as u32,
            u32::MAX,
            0u32,
        );
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        for fd in 0..3 {
            if null >= 0 && null != fd {
                libc::dup2(null, fd);
            }
        }
    }
    let code = match catch_unwind(AssertUnwindSafe(work)) {
        Ok(result) => {
            // SAFETY: the pipe's write end, owned by this process alone from here.
            let mut pipe = unsafe { File::from_raw_fd(write_end) };
            let mut framed = (result.len() as u64).to_le_bytes().to_vec();
            framed.extend_from_slice(&result);
            // A caller that is gone cannot read it (EPIPE, SIGPIPE blocked): nothing to do then.
            let _ = pipe.write_all(&framed);
            0
        }
        Err(_) => 1,
    };
    // SAFETY: leaves without running the caller's exit handlers or destructors.
    unsafe { libc::_exit(code) }
}

/// Reads `pipe` to its end, or fails with `TimedOut` at `deadline`.
///
/// What the pipe holds when the deadline has passed is still read: a caller that got no CPU
/// until after its deadline (a host the engine saturates) must not call a child that had
/// finished in time wedged. Only a pipe with nothing more to read at its deadline times out.
fn read_within(mut pipe: File, out: &mut Vec<u8>, deadline: Instant) -> io::Result<()> {
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut pfd = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Past the deadline: a last look, without waiting.
        let ms = if left.is_zero() {
            0
        } else {
            left.as_millis().clamp(1, i32::MAX as u128) as i32
        };
        // SAFETY: one valid pollfd.
        match unsafe { libc::poll(&mut pfd, 1, ms) } {
            0 if left.is_zero() => return Err(io::ErrorKind::TimedOut.into()),
            0 => continue,
            n if n < 0 => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            _ => match pipe.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => out.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            },
        }
    }
}

fn reap(pid: libc::pid_t) -> i32 {
    let mut status = 0;
    loop {
        // SAFETY: waits for our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r >= 0 || io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return status;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hands_back_what_the_work_returned() {
        let parent = std::process::id();
        let out = run(Duration::from_secs(60), || {
            std::process::id().to_le_bytes().to_vec()
        })
        .unwrap();
        let child = u32::from_le_bytes(out.try_into().unwrap());
        assert_ne!(child, parent, "the work ran in another process");
    }

    #[test]
    fn a_child_that_dies_midway_is_an_error() {
        let err = run(Duration::from_secs(60), || panic!("work failed")).unwrap_err();
        assert!(err.to_string().contains("without handing back"), "{err}");
    }

    #[test]
    fn a_child_that_does_not_finish_in_time_is_left_to_finish_alone() {
        let t = Instant::now();
        let err = run(Duration::from_millis(200), || {
            std::thread::sleep(Duration::from_secs(5));
            vec![]
        })
        .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() < Duration::from_secs(5), "waited for the child");
        // It says what the child was doing: asleep.
        let text = err.to_string();
        assert!(
            text.contains("has not handed back") && text.contains("state S"),
            "{text}"
        );
    }

    #[test]
    fn a_result_handed_back_in_time_is_read_after_the_deadline() {
        // A caller that gets the CPU only after its deadline: the child had finished.
        let mut fds = [0 as RawFd; 2];
        // SAFETY: pipe2 fills the two-element array.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both ends are ours alone; each File owns one.
        let (read_end, mut write_end) =
            unsafe { (File::from_raw_fd(fds[0]), File::from_raw_fd(fds[1])) };
        write_end.write_all(b"done").unwrap();
        drop(write_end);
        let mut out = Vec::new();
        read_within(read_end, &mut out, Instant::now()).unwrap();
        assert_eq!(out, b"done");
    }

    #[test]
    fn the_child_holds_none_of_the_callers_files() {
        let kept = File::open("/proc/self/stat").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&kept);
        let out = run(Duration::from_secs(60), move || {
            let open = std::path::Path::new(&format!("/proc/self/fd/{fd}")).exists();
            vec![open as u8]
        })
        .unwrap();
        assert_eq!(out, [0]);
    }
}
