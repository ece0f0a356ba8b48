//! Why a PEP 768 request could not be read, validated, sent or cancelled. Each message names
//! the fix.

use std::io;

use thiserror::Error;

/// Why a PEP 768 request could not be read, validated, sent or cancelled.
#[derive(Debug, Error)]
pub enum Pep768Error {
    /// Reading the target's memory failed.
    #[error("reading {what} at {addr:#x} in the target failed ({error}): check that the target is still \
                 running and that stallscope may read its memory (root or CAP_SYS_PTRACE, \
                 /proc/sys/kernel/yama/ptrace_scope)")]
    Read {
        /// What was being read.
        what: &'static str,
        /// Where.
        addr: u64,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// Writing the target's memory failed.
    #[error("writing {what} at {addr:#x} in the target failed ({error}): check that the target is still \
                 running and that stallscope may write its memory (root or CAP_SYS_PTRACE, \
                 /proc/sys/kernel/yama/ptrace_scope)")]
    Write {
        /// What was being written.
        what: &'static str,
        /// Where.
        addr: u64,
        /// The OS error.
        #[source]
        error: io::Error,
    },
    /// No `"xdebugpy"` cookie at the given address.
    #[error("no CPython debug offsets at {addr:#x} (found {:?} where \"xdebugpy\" was expected): the address \
                 is not the _PyRuntime symbol (or .PyRuntime section) of a CPython 3.12+ runtime — pass the \
                 _PyRuntime of the libpython or python executable the target has mapped", String::from_utf8_lossy(.found))]
    BadCookie {
        /// The address given as `_PyRuntime`.
        addr: u64,
        /// The 8 bytes found there.
        found: [u8; 8],
    },
    /// A CPython older than 3.14 (no `debugger_support` table), or not CPython 3 at all.
    #[error("the target runs CPython {version}, which has no PEP 768 remote execution (it needs 3.14+): \
                 use the pending-call injection for 3.10–3.13")]
    TooOld {
        /// The version, as `3.13.1`.
        version: String,
    },
    /// A minor version newer than the layouts this module knows.
    #[error("the target runs CPython {version}, whose _Py_DebugOffsets layout stallscope does not know (it \
                 knows 3.14; the layout changes between minor versions): update stallscope for this version")]
    UnknownLayout {
        /// The version.
        version: String,
    },
    /// An alpha or beta of 3.14, whose layout may differ from the release's.
    #[error("the target runs CPython {version}, a pre-release whose _Py_DebugOffsets layout may differ from \
                 3.14's: run the target on a 3.14 release (3.14.0 or later, or a release candidate)")]
    PreRelease {
        /// The version.
        version: String,
    },
    /// The values read do not fit the 3.14 layout.
    #[error("the debug offsets of the target's CPython {version} do not match the 3.14 layout ({detail}); \
                 nothing was written: run the target on an unmodified CPython 3.14 release")]
    LayoutMismatch {
        /// The version the target reports.
        version: String,
        /// Which check failed.
        detail: String,
    },
    /// The runtime has no interpreter (not initialized yet, or already torn down).
    #[error("the target's CPython runtime has no main interpreter (it is still starting or already shut \
                 down): retry once it runs Python code")]
    NoInterpreter,
    /// The runtime is finalizing: the request would never run.
    #[error(
        "the target's CPython runtime is shutting down, so a script would never run: attach to a \
                 running process"
    )]
    Finalizing,
    /// `config.remote_debug` is not 1 in the target.
    #[error("remote debugging (PEP 768) is disabled in the target (config.remote_debug = {value}): it was \
                 started with PYTHON_DISABLE_REMOTE_DEBUG set (to any value, even empty) or with \
                 -X disable-remote-debug, or its CPython was built --without-remote-debug; restart it without \
                 these")]
    Disabled {
        /// The value found (0 when disabled).
        value: i32,
    },
    /// The main interpreter has no main thread state.
    #[error("the target's main interpreter ({interp:#x}) has no main thread state (an embedding \
                 application that does not run __main__, or the main thread is exiting): PEP 768 runs scripts \
                 on the main thread, so run the workload from a `python` entry point")]
    NoMainThread {
        /// The interpreter's address.
        interp: u64,
    },
    /// A thread-state address of 0 was passed.
    #[error("thread-state address 0: pass the address request_script returned")]
    NullThreadState,
    /// The script path is empty or not absolute.
    #[error("script path {path:?} is not absolute: pass the absolute path as the target sees it (inside \
                 its mount namespace)")]
    PathNotAbsolute {
        /// The path given.
        path: String,
    },
    /// The script path contains a NUL byte.
    #[error("script path {path:?} contains a NUL byte: pass a path without one")]
    PathHasNul {
        /// The path given.
        path: String,
    },
    /// The script path does not fit the target's buffer with its NUL.
    #[error("script path is {len} bytes but the target's buffer holds {} plus the terminating NUL: use a \
                 shorter path (e.g. under /tmp)", .size.saturating_sub(1))]
    PathTooLong {
        /// Its length in bytes.
        len: usize,
        /// The buffer size (the path must be at most `size - 1` bytes).
        size: u64,
    },
}
