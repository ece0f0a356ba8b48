//! CPython 3.14's `_Py_DebugOffsets` (`Include/internal/pycore_debug_offsets.h`) as `#[repr(C)]`
//! structs: a `char cookie[8]` and tables holding only `uint64_t`s, members in the header's
//! declaration order. The tables stallscope reads have their members named; the others are
//! arrays of their length so that everything after them sits where the header puts it. The
//! member order (with 3.14's `code_object_generation`, `tlbc_generation`, `tlbc_index`,
//! `co_tlbc` and `llist_node`) was checked against bindgen output of the v3.14.0 headers; the
//! tests pin the positions that follow from it.

use std::mem::{offset_of, size_of};

/// `_Py_DebugOffsets` of CPython 3.14, as it lies at the start of `_PyRuntime`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DebugOffsets314 {
    /// `"xdebugpy"`.
    pub cookie: [u8; 8],
    /// `PY_VERSION_HEX`.
    pub version: u64,
    /// 1 on `Py_GIL_DISABLED` builds.
    pub free_threaded: u64,
    pub runtime_state: RuntimeState,
    pub interpreter_state: InterpreterState,
    pub thread_state: ThreadState,
    /// size, previous, executable, instr_ptr, localsplus, owner, stackpointer, tlbc_index.
    pub interpreter_frame: [u64; 8],
    /// size, filename, name, qualname, linetable, firstlineno, argcount, localsplusnames,
    /// localspluskinds, co_code_adaptive, co_tlbc.
    pub code_object: [u64; 11],
    pub pyobject: [u64; 2],
    pub type_object: [u64; 4],
    pub tuple_object: [u64; 3],
    pub list_object: [u64; 3],
    pub set_object: [u64; 4],
    pub dict_object: [u64; 3],
    pub float_object: [u64; 2],
    pub long_object: [u64; 3],
    pub bytes_object: [u64; 3],
    pub unicode_object: [u64; 4],
    pub gc: [u64; 2],
    pub gen_object: [u64; 4],
    pub llist_node: [u64; 2],
    pub debugger_support: DebuggerSupport,
}

/// `runtime_state`: offsets in `_PyRuntimeState`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RuntimeState {
    /// `sizeof(_PyRuntimeState)`.
    pub size: u64,
    /// `_finalizing`: the finalizing thread, or NULL.
    pub finalizing: u64,
    /// `interpreters.head`.
    pub interpreters_head: u64,
}

/// `interpreter_state`: offsets in `PyInterpreterState`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct InterpreterState {
    /// `sizeof(PyInterpreterState)`.
    pub size: u64,
    /// `id` (an `int64_t`, 0 for the main interpreter).
    pub id: u64,
    pub next: u64,
    pub threads_head: u64,
    /// `threads.main`.
    pub threads_main: u64,
    /// gc, imports_modules, sysdict, builtins, ceval_gil, gil_runtime_state,
    /// gil_runtime_state_enabled, gil_runtime_state_locked, gil_runtime_state_holder,
    /// code_object_generation, tlbc_generation.
    pub rest: [u64; 11],
}

/// `thread_state`: offsets in `PyThreadState`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ThreadState {
    /// `sizeof(PyThreadState)`.
    pub size: u64,
    /// prev, next, interp, current_frame, thread_id, native_thread_id, datastack_chunk, status.
    pub rest: [u64; 8],
}

/// `debugger_support` (new in 3.14): what PEP 768's remote execution writes.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DebuggerSupport {
    /// `offsetof(PyThreadState, eval_breaker)` (a `uintptr_t`).
    pub eval_breaker: u64,
    /// `offsetof(PyThreadState, remote_debugger_support)`.
    pub remote_debugger_support: u64,
    /// `offsetof(PyInterpreterState, config.remote_debug)` (a C `int`).
    pub remote_debugging_enabled: u64,
    /// `offsetof(_PyRemoteDebuggerSupport, debugger_pending_call)` (an `int32_t`).
    pub debugger_pending_call: u64,
    /// `offsetof(_PyRemoteDebuggerSupport, debugger_script_path)`.
    pub debugger_script_path: u64,
    /// `MAX_SCRIPT_PATH_SIZE`: the path buffer's size, NUL included.
    pub debugger_script_path_size: u64,
}

impl DebugOffsets314 {
    /// The bytes read from the target, as the struct; None unless there are exactly
    /// `size_of::<Self>()` of them.
    pub fn from_bytes(bytes: &[u8]) -> Option<DebugOffsets314> {
        (bytes.len() == size_of::<Self>()).then(|| {
            // SAFETY: the buffer holds size_of::<Self>() bytes (checked), the read is unaligned,
            // and every field is an integer or an array of integers, for which any bit pattern
            // is a valid value. The target runs on this machine, so its byte order is ours.
            unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<DebugOffsets314>()) }
        })
    }
}

/// Where the members stallscope reads lie, in bytes from the start of `_Py_DebugOffsets`.
pub mod at {
    use super::*;

    type D = DebugOffsets314;

    pub const VERSION: u64 = offset_of!(D, version) as u64;
    pub const FREE_THREADED: u64 = offset_of!(D, free_threaded) as u64;
    pub const RUNTIME_SIZE: u64 = offset_of!(D, runtime_state.size) as u64;
    pub const RUNTIME_FINALIZING: u64 = offset_of!(D, runtime_state.finalizing) as u64;
    pub const RUNTIME_INTERPRETERS_HEAD: u64 =
        offset_of!(D, runtime_state.interpreters_head) as u64;
    pub const INTERP_SIZE: u64 = offset_of!(D, interpreter_state.size) as u64;
    pub const INTERP_ID: u64 = offset_of!(D, interpreter_state.id) as u64;
    pub const INTERP_NEXT: u64 = offset_of!(D, interpreter_state.next) as u64;
    pub const INTERP_THREADS_MAIN: u64 = offset_of!(D, interpreter_state.threads_main) as u64;
    pub const TSTATE_SIZE: u64 = offset_of!(D, thread_state.size) as u64;
    pub const EVAL_BREAKER: u64 = offset_of!(D, debugger_support.eval_breaker) as u64;
    pub const REMOTE_DEBUGGER_SUPPORT: u64 =
        offset_of!(D, debugger_support.remote_debugger_support) as u64;
    pub const REMOTE_DEBUGGING_ENABLED: u64 =
        offset_of!(D, debugger_support.remote_debugging_enabled) as u64;
    pub const DEBUGGER_PENDING_CALL: u64 =
        offset_of!(D, debugger_support.debugger_pending_call) as u64;
    pub const DEBUGGER_SCRIPT_PATH: u64 =
        offset_of!(D, debugger_support.debugger_script_path) as u64;
    pub const DEBUGGER_SCRIPT_PATH_SIZE: u64 =
        offset_of!(D, debugger_support.debugger_script_path_size) as u64;
    /// `sizeof(_Py_DebugOffsets)`: the bytes read at once.
    pub const SIZE: u64 = size_of::<D>() as u64;
}

#[cfg(test)]
mod tests {
    use super::at;

    /// The positions of the v3.14.0 header (bindgen's `offsetof` values), member by member.
    #[test]
    fn positions_match_the_3_14_header() {
        let cases = [
            ("version", at::VERSION, 8),
            ("free_threaded", at::FREE_THREADED, 16),
            ("runtime_state.size", at::RUNTIME_SIZE, 24),
            ("runtime_state.finalizing", at::RUNTIME_FINALIZING, 32),
            (
                "runtime_state.interpreters_head",
                at::RUNTIME_INTERPRETERS_HEAD,
                40,
            ),
            ("interpreter_state.size", at::INTERP_SIZE, 48),
            ("interpreter_state.id", at::INTERP_ID, 56),
            ("interpreter_state.next", at::INTERP_NEXT, 64),
            (
                "interpreter_state.threads_main",
                at::INTERP_THREADS_MAIN,
                80,
            ),
            ("thread_state.size", at::TSTATE_SIZE, 176),
            ("debugger_support.eval_breaker", at::EVAL_BREAKER, 712),
            (
                "debugger_support.remote_debugger_support",
                at::REMOTE_DEBUGGER_SUPPORT,
                720,
            ),
            (
                "debugger_support.remote_debugging_enabled",
                at::REMOTE_DEBUGGING_ENABLED,
                728,
            ),
            (
                "debugger_support.debugger_pending_call",
                at::DEBUGGER_PENDING_CALL,
                736,
            ),
            (
                "debugger_support.debugger_script_path",
                at::DEBUGGER_SCRIPT_PATH,
                744,
            ),
            (
                "debugger_support.debugger_script_path_size",
                at::DEBUGGER_SCRIPT_PATH_SIZE,
                752,
            ),
            ("sizeof(_Py_DebugOffsets)", at::SIZE, 760),
        ];
        for (member, got, header) in cases {
            assert_eq!(got, header, "{member}");
        }
    }
}
