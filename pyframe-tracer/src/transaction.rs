//! Remote calls that no kill of stallscope can cut short.
//!
//! While a thread is borrowed its registers point into a call: if its tracer died then, the
//! kernel would detach the thread as it is (`exit_ptrace`, kernel/ptrace.c) and the target would
//! crash when the call returned to address 0. So a whole transaction — borrowing the thread, the
//! calls, the memory writes between them and the release — runs in a helper process
//! ([`sys_util::detached`]) that finishes it whatever becomes of the daemon, and hands back what
//! the calls returned and how long the thread was stopped. The helper logs nothing: a logger's
//! lock may have been held by another thread of the daemon when it forked.

use std::time::Duration;

use serde::{de::DeserializeOwned, Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::remote_call::{self, BorrowedThread, Options};

/// What a transaction's work returned, and how long the borrowed thread was stopped.
#[derive(Debug)]
pub struct Done<T> {
    /// The work's result.
    pub value: T,
    /// How long the target's thread was held.
    pub pause: Duration,
}

/// Borrows a thread of `pid` (see [`remote_call`]), runs `work` on it and releases it, all in a
/// helper process that completes even if this one is killed midway.
pub fn run<T: Serialize + DeserializeOwned>(
    pid: i32,
    options: Options,
    work: impl FnOnce(&mut BorrowedThread) -> Result<T>,
) -> Result<Done<T>> {
    let bytes = sys_util::detached::run(patience(&options), || {
        log::set_max_level(log::LevelFilter::Off);
        realtime();
        let outcome = remote_call::borrow_thread(pid, options).and_then(|mut thread| {
            let value = work(&mut thread);
            let pause = thread.release()?;
            Ok((value?, pause))
        });
        let wire = match outcome {
            Ok((value, pause)) => Wire::Done {
                value,
                pause_ns: pause.as_nanos() as u64,
            },
            Err(e) => Wire::Failed(WireError::from(e)),
        };
        serde_json::to_vec(&wire).unwrap_or_default()
    })
    .map_err(|e| Error::io("running the remote-call helper process", e))?;
    match serde_json::from_slice::<Wire<T>>(&bytes) {
        Ok(Wire::Done { value, pause_ns }) => Ok(Done {
            value,
            pause: Duration::from_nanos(pause_ns),
        }),
        Ok(Wire::Failed(e)) => Err(e.into_error(pid)),
        Err(e) => Err(Error::RemoteCallFailed {
            pid,
            what: format!("the helper process's answer is unreadable: {e}"),
        }),
    }
}

/// The most calls a transaction makes on its thread (the injection makes two: mmap and
/// Py_AddPendingCall).
const MAX_CALLS: u32 = 8;

/// How long the caller waits for the helper: its own limits (finding a thread, each call) and
/// 10 s for its waits for a CPU. A helper past this is wedged, not slow: the caller stops
/// waiting and says what it is doing ([`sys_util::detached`]).
fn patience(options: &Options) -> Duration {
    options.find_thread_timeout + options.call_timeout * MAX_CALLS + Duration::from_secs(10)
}

/// Puts the helper at SCHED_FIFO (priority 1) where the process may: the thread it holds
/// stays stopped through each of the helper's waits for a CPU, and on a host whose CPUs the
/// engine saturates a wait at the normal policy is a time slice or more (the soak measured a
/// p99 hold of 70-230 ms under vLLM's load). The helper sleeps between its polls of the
/// stopped thread and ends with the transaction, so it takes little CPU at that priority;
/// where the policy is refused (no CAP_SYS_NICE) it stays at the normal one.
fn realtime() {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: sched_setscheduler on this process (pid 0) with a valid policy and parameter;
    // failure leaves the policy as it was.
    let _ = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
}

#[derive(Serialize, Deserialize)]
enum Wire<T> {
    Done { value: T, pause_ns: u64 },
    Failed(WireError),
}

/// The errors a transaction can end with, as they cross from the helper process.
#[derive(Debug, Serialize, Deserialize)]
enum WireError {
    NoSuchProcess(i32),
    TargetExited(i32),
    AlreadyTraced {
        pid: i32,
        tracer: i32,
        tracer_comm: String,
    },
    PtraceDenied {
        pid: i32,
        reason: String,
    },
    NoSafeThread {
        pid: i32,
        waited_ms: u64,
        states: String,
    },
    RemoteCallTimeout {
        pid: i32,
        ms: u64,
    },
    RemoteCallFailed {
        pid: i32,
        what: String,
    },
    Io {
        what: String,
        os: Option<i32>,
        text: String,
    },
    Other(String),
}

impl From<Error> for WireError {
    fn from(e: Error) -> Self {
        match e {
            Error::NoSuchProcess(pid) => Self::NoSuchProcess(pid),
            Error::TargetExited(pid) => Self::TargetExited(pid),
            Error::AlreadyTraced {
                pid,
                tracer,
                tracer_comm,
            } => Self::AlreadyTraced {
                pid,
                tracer,
                tracer_comm,
            },
            Error::PtraceDenied { pid, reason } => Self::PtraceDenied { pid, reason },
            Error::NoSafeThread {
                pid,
                waited_ms,
                states,
            } => Self::NoSafeThread {
                pid,
                waited_ms,
                states,
            },
            Error::RemoteCallTimeout { pid, ms } => Self::RemoteCallTimeout { pid, ms },
            Error::RemoteCallFailed { pid, what } => Self::RemoteCallFailed { pid, what },
            Error::Io { what, source } => Self::Io {
                what,
                os: source.raw_os_error(),
                text: source.to_string(),
            },
            other => Self::Other(other.to_string()),
        }
    }
}

impl WireError {
    fn into_error(self, pid: i32) -> Error {
        match self {
            Self::NoSuchProcess(pid) => Error::NoSuchProcess(pid),
            Self::TargetExited(pid) => Error::TargetExited(pid),
            Self::AlreadyTraced {
                pid,
                tracer,
                tracer_comm,
            } => Error::AlreadyTraced {
                pid,
                tracer,
                tracer_comm,
            },
            Self::PtraceDenied { pid, reason } => Error::PtraceDenied { pid, reason },
            Self::NoSafeThread {
                pid,
                waited_ms,
                states,
            } => Error::NoSafeThread {
                pid,
                waited_ms,
                states,
            },
            Self::RemoteCallTimeout { pid, ms } => Error::RemoteCallTimeout { pid, ms },
            Self::RemoteCallFailed { pid, what } => Error::RemoteCallFailed { pid, what },
            Self::Io { what, os, text } => Error::io(
                what,
                os.map_or_else(
                    || std::io::Error::other(text),
                    std::io::Error::from_raw_os_error,
                ),
            ),
            Self::Other(what) => Error::RemoteCallFailed { pid, what },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_cross_the_process_boundary_intact() {
        let cases = [
            Error::NoSuchProcess(7),
            Error::TargetExited(7),
            Error::AlreadyTraced {
                pid: 7,
                tracer: 9,
                tracer_comm: "gdb".into(),
            },
            Error::PtraceDenied {
                pid: 7,
                reason: "Operation not permitted".into(),
            },
            Error::NoSafeThread {
                pid: 7,
                waited_ms: 3000,
                states: "7:futex".into(),
            },
            Error::RemoteCallTimeout { pid: 7, ms: 1000 },
            Error::RemoteCallFailed {
                pid: 7,
                what: "SIGSEGV at 0x10".into(),
            },
            Error::io(
                "writing the request into the target",
                std::io::Error::from_raw_os_error(libc::EFAULT),
            ),
        ];
        for e in cases {
            let text = e.to_string();
            let wire = serde_json::to_vec(&WireError::from(e)).unwrap();
            let back = serde_json::from_slice::<WireError>(&wire)
                .unwrap()
                .into_error(7);
            assert_eq!(back.to_string(), text);
        }
    }

    #[test]
    fn a_transaction_on_a_missing_process_fails_with_its_error() {
        // The helper runs, borrows nothing and hands back the typed error.
        let err = run(i32::MAX, Options::default(), |_| Ok(())).unwrap_err();
        assert!(matches!(err, Error::NoSuchProcess(_)), "{err}");
    }
}
