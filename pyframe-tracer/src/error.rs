//! Errors of the Python plane. Each message names the problem and the fix.

use thiserror::Error;

/// Why attaching to, calling into or probing a target failed.
#[derive(Debug, Error)]
pub enum Error {
    /// The pid does not exist.
    #[error("no process with pid {0}: check the pid (is the engine still running?)")]
    NoSuchProcess(i32),
    /// The target went away while we were working on it.
    #[error("process {0} exited while stallscope was attaching; nothing was left behind — start it again and re-run")]
    TargetExited(i32),
    /// No CPython runtime is mapped in the target.
    #[error("process {pid} ({comm}) is not a Python process: no libpython or python executable with the CPython runtime is mapped — pass the pid of the Python interpreter")]
    NotPython {
        /// Target pid.
        pid: i32,
        /// Its command name.
        comm: String,
    },
    /// A CPython version we cannot attach to.
    #[error("process {pid} runs CPython {version}, which stallscope does not support: supported are 3.10, 3.11, 3.12, 3.13 and 3.14+ (PEP 768)")]
    UnsupportedVersion {
        /// Target pid.
        pid: i32,
        /// The version found.
        version: String,
    },
    /// Another tracer (a debugger, strace, another stallscope) holds the target.
    #[error("process {pid} is already traced by pid {tracer} ({tracer_comm}): detach that debugger or tracer first")]
    AlreadyTraced {
        /// Target pid.
        pid: i32,
        /// The tracer's pid.
        tracer: i32,
        /// The tracer's command name.
        tracer_comm: String,
    },
    /// ptrace was refused.
    #[error("ptrace of process {pid} not permitted ({reason}): run stallscope as root or with CAP_SYS_PTRACE (and check /proc/sys/kernel/yama/ptrace_scope)")]
    PtraceDenied {
        /// Target pid.
        pid: i32,
        /// The errno text.
        reason: String,
    },
    /// The target was stopped (SIGSTOP) so its interpreter cannot reach a safe point.
    #[error(
        "process {0} is stopped (SIGSTOP or a debugger): continue it (kill -CONT {0}) and re-run"
    )]
    TargetStopped(i32),
    /// No thread was in a syscall where it is safe to borrow it.
    #[error("no thread of process {pid} reached a safe point (a thread parked in read/poll/sleep/…) within {waited_ms} ms; its threads were in: {states}. Retry when the target is less busy")]
    NoSafeThread {
        /// Target pid.
        pid: i32,
        /// How long we waited.
        waited_ms: u64,
        /// What each thread was doing.
        states: String,
    },
    /// A symbol the injection needs is missing.
    #[error("symbol {symbol} not found in process {pid}: its CPython build is not supported (stripped dynamic symbols?)")]
    MissingSymbol {
        /// Target pid.
        pid: i32,
        /// The symbol.
        symbol: String,
    },
    /// A remote call did not return in time.
    #[error(
        "remote call into process {pid} did not return within {ms} ms; the thread was restored"
    )]
    RemoteCallTimeout {
        /// Target pid.
        pid: i32,
        /// The limit.
        ms: u64,
    },
    /// A remote call crashed or stopped somewhere unexpected.
    #[error(
        "remote call into process {pid} stopped unexpectedly ({what}); registers were restored"
    )]
    RemoteCallFailed {
        /// Target pid.
        pid: i32,
        /// What happened.
        what: String,
    },
    /// The interpreter did not run the injected code in time.
    #[error("the main thread of process {pid} did not reach the Python eval loop within {ms} ms (it may be blocked in a long C call or syscall); the request was cancelled and the target is unchanged — retry when it is active")]
    NotAtSafePoint {
        /// Target pid.
        pid: i32,
        /// The limit.
        ms: u64,
    },
    /// The probe inside the target refused a request.
    #[error("{0}")]
    Probe(String),
    /// Another session's probes hold the target: their stallscope renews their lease.
    #[error("{why}")]
    Watched {
        /// The probe's account (who, how long ago the lease was renewed).
        why: String,
        /// When the lease runs out if its holder has stopped renewing it.
        retry_after: std::time::Duration,
    },
    /// A watch spec could not be parsed.
    #[error("bad watch spec {spec:?}: {why}. Expected MODULE:QUALNAME[name=EXPR;...] with EXPR an attribute path from a parameter, optionally in len(...) or sum(...)")]
    BadSpec {
        /// The spec as given.
        spec: String,
        /// What is wrong.
        why: String,
    },
    /// A framework profile is malformed or unknown.
    #[error("framework profile: {0}")]
    Profile(String),
    /// A PEP 768 request (CPython 3.14+) could not be sent.
    #[error(transparent)]
    Pep768(#[from] crate::pep768::Pep768Error),
    /// An OS error with what we were doing (the cause follows in the error's chain).
    #[error("{what}")]
    Io {
        /// What we were doing.
        what: String,
        /// The cause.
        source: std::io::Error,
    },
}

impl Error {
    /// Wraps an I/O error with what we were doing.
    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io {
            what: what.into(),
            source,
        }
    }
}

/// Result of the Python plane.
pub type Result<T> = std::result::Result<T, Error>;
