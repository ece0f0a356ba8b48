//! Calling a function inside another process with ptrace, safely.
//!
//! The one rule that keeps the target alive: only borrow a thread that is parked in a *safe* syscall (sleeping,
//! polling, reading, …), never one in futex or anywhere it may hold a lock (inside malloc, the loader, …).
//! A thread is borrowed in one of two ways:
//! - **parked**: a thread already blocked in a safe syscall (from `/proc/PID/task/*/syscall`) is interrupted
//!   (`PTRACE_INTERRUPT`); its registers prove it was in that syscall. Restoring them exactly lets the kernel
//!   restart the syscall.
//! - **at syscall entry**: for busy targets, threads are traced until one enters a safe syscall
//!   (`PTRACE_SYSCALL`); the syscall is skipped for the call and re-issued afterwards (rip − 2, rax = nr).
//!
//! A call: rsp moves below the red zone and 16-byte aligned, return address 0, args in rdi…r9, orig_rax = −1
//! (so the interrupted syscall is not restarted over the call), continue, and catch the SIGSEGV at address 0.
//! Signals that arrive for the thread meanwhile are held and re-delivered after detaching. Detaching leaves the
//! target running, or stopped if it was stopped. While held, the thread runs its calls at SCHED_FIFO
//! ([`crate::boost`]) so that no wait for a CPU lengthens the hold. A borrow happens only inside a [`crate::transaction`], in a
//! helper process that finishes it even if stallscope is killed (if the tracer died mid-call, the target would
//! crash when the call returned to address 0).

#[cfg(not(target_arch = "x86_64"))]
compile_error!("remote calls are implemented for x86-64 only");

use std::time::{Duration, Instant};

use libc::user_regs_struct;
use nix::errno::Errno;
use nix::sys::ptrace;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::boost::Boost;
use crate::error::{Error, Result};
use crate::memory::{ProcessMemory, RemoteMemory};
use crate::procfs;

/// Syscalls in which a thread holds no user-space lock we could need: it is waiting for I/O, time or a child.
/// (x86-64 numbers.) futex is deliberately absent: a thread in futex may be inside malloc or the loader.
const SAFE_SYSCALLS: &[(i64, &str)] = &[
    (0, "read"),
    (1, "write"),
    (7, "poll"),
    (23, "select"),
    (24, "sched_yield"),
    (34, "pause"),
    (35, "nanosleep"),
    (43, "accept"),
    (45, "recvfrom"),
    (47, "recvmsg"),
    (61, "wait4"),
    (128, "rt_sigtimedwait"),
    (130, "rt_sigsuspend"),
    (230, "clock_nanosleep"),
    (232, "epoll_wait"),
    (247, "waitid"),
    (270, "pselect6"),
    (271, "ppoll"),
    (281, "epoll_pwait"),
    (288, "accept4"),
    (299, "recvmmsg"),
    (441, "epoll_pwait2"),
];

const ENOSYS: u64 = (-(libc::ENOSYS as i64)) as u64;

/// Name of a safe syscall, or None if `nr` is not safe to borrow a thread in.
pub fn safe_syscall(nr: i64) -> Option<&'static str> {
    SAFE_SYSCALLS
        .iter()
        .find(|(n, _)| *n == nr)
        .map(|(_, name)| *name)
}

/// Limits for borrowing a thread and for each call.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// How long to look for a thread at a safe point before giving up.
    pub find_thread_timeout: Duration,
    /// How long one call may run.
    pub call_timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            find_thread_timeout: Duration::from_secs(3),
            call_timeout: Duration::from_secs(1),
        }
    }
}

/// How the borrowed thread was stopped, which decides how it is resumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Borrow {
    /// Interrupted while blocked in (or returning from) this safe syscall.
    Parked(&'static str),
    /// Caught entering this safe syscall; it is re-issued on release.
    SyscallEntry(&'static str),
}

/// A thread of the target, stopped under ptrace, that we may run calls on. Release it (or drop it) to restore
/// its registers and let it go.
pub struct BorrowedThread {
    pid: i32,
    tid: Pid,
    saved: user_regs_struct,
    how: Borrow,
    intercepted: Vec<Signal>,
    released: bool,
    stopped_at: Instant,
    options: Options,
    /// Its raise to SCHED_FIFO for the hold, put back before it is let go.
    boost: Option<Boost>,
}

impl std::fmt::Debug for BorrowedThread {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BorrowedThread")
            .field("pid", &self.pid)
            .field("tid", &self.tid)
            .field("how", &self.how)
            .finish()
    }
}

impl BorrowedThread {
    /// The borrowed thread's id.
    pub fn tid(&self) -> i32 {
        self.tid.as_raw()
    }

    /// How it was borrowed.
    pub fn how(&self) -> Borrow {
        self.how
    }

    /// Calls `func(args…)` (at most 6 integer args) on the borrowed thread and returns rax.
    pub fn call(&mut self, func: u64, args: &[u64]) -> Result<u64> {
        assert!(args.len() <= 6, "at most 6 register arguments");
        let mut regs = self.saved;
        let sp = ((self.saved.rsp - 512) & !15) - 8;
        ProcessMemory::new(self.pid)
            .write(sp, &0u64.to_le_bytes())
            .map_err(|e| self.failed(format!("writing the return address: {e}")))?;
        regs.rsp = sp;
        regs.rip = func;
        regs.rax = 0;
        regs.orig_rax = u64::MAX;
        let slots = [
            &mut regs.rdi,
            &mut regs.rsi,
            &mut regs.rdx,
            &mut regs.rcx,
            &mut regs.r8,
            &mut regs.r9,
        ];
        for (slot, v) in slots.into_iter().zip(args) {
            *slot = *v;
        }
        ptrace::setregs(self.tid, regs).map_err(|e| self.errno(e, "setting registers"))?;
        ptrace::cont(self.tid, None).map_err(|e| self.errno(e, "continuing"))?;
        let deadline = Instant::now() + self.options.call_timeout;
        loop {
            match wait_stop(self.tid, deadline)
                .map_err(|e| self.errno(e, "waiting for the call"))?
            {
                None => {
                    // Timed out: stop the thread wherever it is; release() puts its registers back.
                    let _ = ptrace::interrupt(self.tid);
                    let _ = wait_stop(self.tid, Instant::now() + Duration::from_secs(1));
                    return Err(Error::RemoteCallTimeout {
                        pid: self.pid,
                        ms: self.options.call_timeout.as_millis() as u64,
                    });
                }
                Some(WaitStatus::Stopped(_, Signal::SIGSEGV)) => {
                    let r = ptrace::getregs(self.tid)
                        .map_err(|e| self.errno(e, "reading registers"))?;
                    if r.rip == 0 {
                        return Ok(r.rax);
                    }
                    return Err(self.failed(format!(
                        "SIGSEGV at {:#x} inside the called function",
                        r.rip
                    )));
                }
                Some(WaitStatus::Stopped(_, sig)) => {
                    self.intercepted.push(sig);
                    ptrace::cont(self.tid, None).map_err(|e| self.errno(e, "continuing"))?;
                }
                Some(WaitStatus::PtraceEvent(..)) | Some(WaitStatus::PtraceSyscall(..)) => {
                    ptrace::cont(self.tid, None).map_err(|e| self.errno(e, "continuing"))?;
                }
                Some(_) => return Err(Error::TargetExited(self.pid)),
            }
        }
    }

    /// Restores the thread's registers, detaches, re-delivers intercepted signals. Returns how long the thread
    /// was held.
    pub fn release(mut self) -> Result<Duration> {
        self.restore()
    }

    fn restore(&mut self) -> Result<Duration> {
        if self.released {
            return Ok(Duration::ZERO);
        }
        self.released = true;
        // Its own scheduling back first, while it is still stopped.
        let unboosted = self.boost.take().map_or(Ok(()), Boost::restore);
        let mut regs = self.saved;
        if let Borrow::SyscallEntry(_) = self.how {
            // Re-issue the syscall we skipped: back over the 2-byte `syscall` instruction, nr in rax.
            regs.rip -= 2;
            regs.rax = regs.orig_rax;
        }
        let set = ptrace::setregs(self.tid, regs);
        let mut signals = std::mem::take(&mut self.intercepted);
        let first = if signals.is_empty() {
            None
        } else {
            Some(signals.remove(0))
        };
        let detached = ptrace::detach(self.tid, first);
        let held = self.stopped_at.elapsed();
        for sig in signals {
            // SAFETY: tgkill with valid ids and a signal number; no memory is passed.
            unsafe { libc::syscall(libc::SYS_tgkill, self.pid, self.tid.as_raw(), sig as i32) };
        }
        match (set, detached) {
            (Ok(()), Ok(())) => unboosted.map(|()| held).map_err(|e| {
                self.failed(format!(
                    "putting back the scheduling policy of thread {}: {e}",
                    self.tid
                ))
            }),
            (Err(Errno::ESRCH), _) | (_, Err(Errno::ESRCH)) => Err(Error::TargetExited(self.pid)),
            (Err(e), _) | (_, Err(e)) => Err(self.failed(format!("restoring the thread: {e}"))),
        }
    }

    fn errno(&self, e: Errno, what: &str) -> Error {
        if e == Errno::ESRCH
            && !std::path::Path::new(&format!("/proc/{}/task/{}", self.pid, self.tid)).exists()
        {
            Error::TargetExited(self.pid)
        } else {
            self.failed(format!("{what}: {e}"))
        }
    }

    fn failed(&self, what: String) -> Error {
        Error::RemoteCallFailed {
            pid: self.pid,
            what,
        }
    }
}

impl Drop for BorrowedThread {
    fn drop(&mut self) {
        if let Err(e) = self.restore() {
            log::warn!("releasing thread {} of {}: {e}", self.tid, self.pid);
        }
    }
}

/// Stops one thread of `pid` at a safe point and lends it out (to a [`crate::transaction`] only).
pub(crate) fn borrow_thread(pid: i32, options: Options) -> Result<BorrowedThread> {
    check_traceable(pid)?;
    let deadline = Instant::now() + options.find_thread_timeout;
    let parked_deadline = Instant::now() + options.find_thread_timeout / 2;
    // 1. A thread already parked in a safe syscall. Every wait below counts against the one
    // deadline: an engine has a hundred threads, and a wait per thread adds up.
    'parked: loop {
        for (tid, nr) in thread_syscalls(pid)? {
            if Instant::now() >= parked_deadline {
                break 'parked;
            }
            let Some(name) = nr.and_then(safe_syscall) else {
                continue;
            };
            match try_parked(pid, tid, name, parked_deadline)? {
                Some((saved, intercepted)) => {
                    return Ok(lend(
                        pid,
                        tid,
                        saved,
                        Borrow::Parked(name),
                        intercepted,
                        options,
                    ))
                }
                None => continue,
            }
        }
        if Instant::now() >= parked_deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // 2. Busy target: catch a thread entering a safe syscall.
    if let Some((tid, saved, name, intercepted)) = catch_syscall_entry(pid, deadline)? {
        return Ok(lend(
            pid,
            tid,
            saved,
            Borrow::SyscallEntry(name),
            intercepted,
            options,
        ));
    }
    let states = thread_syscalls(pid)?
        .iter()
        .map(|(tid, nr)| format!("{tid}:{}", nr.map_or("running".to_string(), syscall_label)))
        .collect::<Vec<_>>()
        .join(", ");
    Err(Error::NoSafeThread {
        pid,
        waited_ms: options.find_thread_timeout.as_millis() as u64,
        states,
    })
}

fn lend(
    pid: i32,
    tid: Pid,
    saved: user_regs_struct,
    how: Borrow,
    intercepted: Vec<Signal>,
    options: Options,
) -> BorrowedThread {
    BorrowedThread {
        pid,
        tid,
        saved,
        how,
        intercepted,
        released: false,
        stopped_at: Instant::now(),
        options,
        boost: Boost::raise(tid.as_raw()),
    }
}

fn syscall_label(nr: i64) -> String {
    safe_syscall(nr).map_or_else(
        || {
            if nr == 202 {
                "futex".into()
            } else {
                format!("syscall {nr}")
            }
        },
        str::to_string,
    )
}

/// Refuses early, with the right message, when the target cannot be traced.
fn check_traceable(pid: i32) -> Result<()> {
    let status = procfs::status(pid)?;
    let tracer: i32 = procfs::status_field(&status, "TracerPid")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    if tracer != 0 {
        let tracer_comm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
            .unwrap_or_default()
            .trim()
            .to_string();
        return Err(Error::AlreadyTraced {
            pid,
            tracer,
            tracer_comm,
        });
    }
    Ok(())
}

/// `(tid, syscall number or None when running in user space)` for every thread.
pub fn thread_syscalls(pid: i32) -> Result<Vec<(Pid, Option<i64>)>> {
    let dir =
        std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| Error::NoSuchProcess(pid))?;
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Ok(tid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let text = std::fs::read_to_string(entry.path().join("syscall")).unwrap_or_default();
        let nr = text
            .split_whitespace()
            .next()
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|n| *n >= 0);
        out.push((Pid::from_raw(tid), nr));
    }
    out.sort_by_key(|(tid, _)| tid.as_raw());
    Ok(out)
}

fn seize(pid: i32, tid: Pid) -> Result<bool> {
    match ptrace::seize(tid, ptrace::Options::PTRACE_O_TRACESYSGOOD) {
        Ok(()) => Ok(true),
        Err(Errno::ESRCH) => Ok(false),
        Err(Errno::EPERM) => {
            check_traceable(pid)?;
            Err(Error::PtraceDenied {
                pid,
                reason: Errno::EPERM.desc().into(),
            })
        }
        Err(e) => Err(Error::PtraceDenied {
            pid,
            reason: e.desc().into(),
        }),
    }
}

/// Interrupts `tid`, which /proc showed in the safe syscall `_name`; keeps it if its registers confirm it is still
/// in (or returning from) a safe syscall.
fn try_parked(
    pid: i32,
    tid: Pid,
    _name: &'static str,
    deadline: Instant,
) -> Result<Option<(user_regs_struct, Vec<Signal>)>> {
    if !seize(pid, tid)? {
        return Ok(None);
    }
    let mut intercepted = Vec::new();
    let stopped = ptrace::interrupt(tid).is_ok()
        && first_stop(tid, &mut intercepted, stop_deadline(deadline));
    if stopped {
        if let Ok(regs) = ptrace::getregs(tid) {
            if safe_syscall(regs.orig_rax as i64).is_some() {
                return Ok(Some((regs, intercepted)));
            }
        }
    }
    let first = if intercepted.is_empty() {
        None
    } else {
        Some(intercepted.remove(0))
    };
    let _ = ptrace::detach(tid, first);
    Ok(None)
}

/// The longest wait for one thread's stop after PTRACE_INTERRUPT.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// When a wait for one stop ends: [`STOP_WAIT`] from now, or `deadline` if sooner.
fn stop_deadline(deadline: Instant) -> Instant {
    deadline.min(Instant::now() + STOP_WAIT)
}

/// Waits until `deadline` for the first stop after PTRACE_INTERRUPT, keeping any signal that
/// stopped it instead.
fn first_stop(tid: Pid, intercepted: &mut Vec<Signal>, deadline: Instant) -> bool {
    match wait_stop(tid, deadline) {
        Ok(Some(WaitStatus::PtraceEvent(..))) => true,
        Ok(Some(WaitStatus::Stopped(_, sig))) => {
            intercepted.push(sig);
            true
        }
        _ => false,
    }
}

/// Traces every thread until one enters a safe syscall; lets all others go.
#[allow(clippy::type_complexity)]
fn catch_syscall_entry(
    pid: i32,
    deadline: Instant,
) -> Result<Option<(Pid, user_regs_struct, &'static str, Vec<Signal>)>> {
    let mut traced: Vec<Pid> = Vec::new();
    for (tid, _) in thread_syscalls(pid)?.into_iter().take(256) {
        if seize(pid, tid)? && ptrace::interrupt(tid).is_ok() {
            traced.push(tid);
        }
    }
    let mut pending: Vec<(Pid, Signal)> = Vec::new();
    let mut running = Vec::new();
    // Interrupted together, so their stops are waited for together: one deadline for all.
    let stops = stop_deadline(deadline);
    for &tid in &traced {
        let mut sigs = Vec::new();
        if first_stop(tid, &mut sigs, stops) {
            pending.extend(sigs.into_iter().map(|s| (tid, s)));
            if ptrace::syscall(tid, None).is_ok() {
                running.push(tid);
            }
        }
    }
    let mut chosen = None;
    'outer: while Instant::now() < deadline && !running.is_empty() {
        let mut progressed = false;
        for &tid in running.clone().iter() {
            match waitpid(tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) => {}
                Ok(WaitStatus::PtraceSyscall(_)) => {
                    progressed = true;
                    if let Ok(regs) = ptrace::getregs(tid) {
                        if let (ENOSYS, Some(name)) = (regs.rax, safe_syscall(regs.orig_rax as i64))
                        {
                            chosen = Some((tid, regs, name));
                            break 'outer;
                        }
                    }
                    let _ = ptrace::syscall(tid, None);
                }
                Ok(WaitStatus::Stopped(_, sig)) => {
                    progressed = true;
                    let _ = ptrace::syscall(tid, Some(sig));
                }
                Ok(WaitStatus::PtraceEvent(..)) => {
                    progressed = true;
                    let _ = ptrace::syscall(tid, None);
                }
                Ok(_) | Err(_) => running.retain(|t| *t != tid),
            }
        }
        if !progressed {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    // Let every other thread go (stopped first: detach needs a stopped tracee). All are
    // interrupted before any stop is waited for, under one deadline. A thread that has not
    // stopped by then is left traced: the kernel detaches it as it is when this process exits
    // (`exit_ptrace`, kernel/ptrace.c), which is safe for each of them: only the chosen one's
    // registers are ever changed.
    let others: Vec<Pid> = traced
        .iter()
        .copied()
        .filter(|&tid| chosen.map(|c| c.0) != Some(tid))
        .collect();
    for tid in &others {
        if running.contains(tid) {
            let _ = ptrace::interrupt(*tid);
        }
    }
    let stops = Instant::now() + STOP_WAIT;
    for tid in others {
        let mut sigs: Vec<Signal> = pending
            .iter()
            .filter(|(t, _)| *t == tid)
            .map(|(_, s)| *s)
            .collect();
        if running.contains(&tid) {
            first_stop(tid, &mut sigs, stops);
        }
        // Fails (ESRCH) for a thread that has not stopped: it is left as said above.
        let _ = ptrace::detach(tid, sigs.first().copied());
    }
    Ok(chosen.map(|(tid, regs, name)| {
        let sigs = pending
            .iter()
            .filter(|(t, _)| *t == tid)
            .map(|(_, s)| *s)
            .collect();
        (tid, regs, name, sigs)
    }))
}

/// How long a wait for a stop polls without sleeping: a stop after PTRACE_INTERRUPT comes in
/// microseconds and a remote call returns in tens of them, while each sleep between polls
/// adds its own wake-up to the time the thread is held.
const SPIN: Duration = Duration::from_micros(100);

/// Polls for a state change of `tid` until `deadline`; None on timeout. The first [`SPIN`]
/// polls back to back, yielding between them: the thread waited for may be queued on this
/// CPU at this helper's real-time priority ([`crate::boost`]), and only a yield lets it run
/// there. Later polls sleep between them, 5 µs doubling to 200 µs.
fn wait_stop(tid: Pid, deadline: Instant) -> nix::Result<Option<WaitStatus>> {
    let spin_until = Instant::now() + SPIN;
    let mut nap = Duration::from_micros(5);
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL | WaitPidFlag::WNOHANG))? {
            WaitStatus::StillAlive => {}
            status => return Ok(Some(status)),
        }
        let now = Instant::now();
        if now >= deadline {
            return Ok(None);
        }
        if now < spin_until {
            std::thread::yield_now();
            continue;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_micros(200));
    }
}
