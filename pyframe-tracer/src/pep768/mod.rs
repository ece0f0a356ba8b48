//! PEP 768 (CPython 3.14+): ask the interpreter to run a script file at its next safe point, by writing into
//! its memory only — no ptrace stop, no code injected.
//!
//! The protocol, as CPython 3.14's own `sys.remote_exec(pid, script)` runs it (`Python/remote_debugging.c`,
//! `send_exec_to_proc_handle`):
//!
//! 1. `_PyRuntime` (also the start of the `.PyRuntime` ELF section) begins with `_Py_DebugOffsets`
//!    (`Include/internal/pycore_debug_offsets.h`): a cookie `"xdebugpy"`, `PY_VERSION_HEX`, then tables of
//!    `offsetof` values for the runtime, interpreter and thread-state structs. 3.14 adds a
//!    `debugger_support` table at its end.
//! 2. The interpreter: the pointer at `_PyRuntime + runtime_state.interpreters_head`. Its
//!    `config.remote_debug` (a C `int`, at `debugger_support.remote_debugging_enabled`) must be 1: it is 0
//!    when the target was started with `PYTHON_DISABLE_REMOTE_DEBUG` set (to any value) or with
//!    `-X disable-remote-debug`, or when its CPython was built `--without-remote-debug`.
//! 3. The thread: `interp->threads.main` (at `interpreter_state.threads_main`), the thread that runs
//!    `__main__`. `sys.remote_exec` always targets it (the C function can take a native tid, which the Python
//!    API never passes).
//! 4. In that `PyThreadState`, `remote_debugger_support` (a `_PyRemoteDebuggerSupport`: `int32_t
//!    debugger_pending_call; char debugger_script_path[512]`): write the path with its NUL (refused unless
//!    shorter than `debugger_script_path_size`), then `debugger_pending_call = 1`, then OR
//!    `_PY_EVAL_PLEASE_STOP_BIT` (`1 << 5`, `Include/internal/pycore_ceval.h`) into the thread state's
//!    `uintptr_t eval_breaker`.
//! 5. At its next eval-breaker check the thread runs `_Py_HandlePending` (`Python/ceval_gil.c`), which ends in
//!    `_PyRunRemoteDebugger`: if `config->remote_debug == 1` and `debugger_pending_call == 1`, it sets the flag
//!    back to 0, copies the path (forcing a NUL in its last byte), and, if the path is not empty, raises the
//!    audit event `cpython.remote_debugger_script` and executes the file. So the flag going back to 0 is the
//!    sign that the request was picked up.
//!
//! One deliberate difference from CPython: it takes the head of the interpreter list, which is the newest
//! interpreter, a sub-interpreter if the target made one; this module walks the list to the interpreter whose
//! `id` is 0, the main one. Without sub-interpreters the two are the same.
//!
//! The layout of `_Py_DebugOffsets` itself changes between minor versions (CPython only sends to its own
//! `major.minor`), so [`layout`] holds 3.14's; a newer minor version is refused until its layout is added
//! there.

mod error;
pub mod layout;

pub use error::Pep768Error;
use layout::{at, DebugOffsets314};

use crate::memory::RemoteMemory;

/// `"xdebugpy"`: `_Py_Debug_Cookie`, the first 8 bytes of `_Py_DebugOffsets`.
const COOKIE: &[u8; 8] = b"xdebugpy";

/// `_PY_EVAL_PLEASE_STOP_BIT` (`Include/internal/pycore_ceval.h`): bit 5 of `PyThreadState.eval_breaker`.
const EVAL_PLEASE_STOP_BIT: u64 = 1 << 5;

/// Upper bound on interpreters walked looking for the main one (guards against a cycle in a corrupt list).
const MAX_INTERPRETERS: usize = 4096;

/// Layout values read from the target's `_Py_DebugOffsets` (at the start of `_PyRuntime`). Offsets are
/// relative to the struct named in each field's doc.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugOffsets {
    /// `PY_VERSION_HEX` of the target.
    pub version: u64,
    /// 1 on free-threaded (`Py_GIL_DISABLED`) builds, else 0.
    pub free_threaded: u64,
    /// `_PyRuntimeState._finalizing`, from `_PyRuntime`.
    pub runtime_finalizing: u64,
    /// `_PyRuntimeState.interpreters.head`, from `_PyRuntime`.
    pub interpreters_head: u64,
    /// `sizeof(PyInterpreterState)`.
    pub interp_size: u64,
    /// `PyInterpreterState.id`.
    pub interp_id: u64,
    /// `PyInterpreterState.next`.
    pub interp_next: u64,
    /// `PyInterpreterState.threads.main`.
    pub threads_main: u64,
    /// `PyInterpreterState.config.remote_debug` (a C `int`).
    pub remote_debugging_enabled: u64,
    /// `sizeof(PyThreadState)`.
    pub tstate_size: u64,
    /// `PyThreadState.eval_breaker` (a `uintptr_t`).
    pub eval_breaker: u64,
    /// `PyThreadState.remote_debugger_support` (a `_PyRemoteDebuggerSupport`).
    pub remote_debugger_support: u64,
    /// `_PyRemoteDebuggerSupport.debugger_pending_call` (an `int32_t`).
    pub debugger_pending_call: u64,
    /// `_PyRemoteDebuggerSupport.debugger_script_path` (a `char[debugger_script_path_size]`).
    pub debugger_script_path: u64,
    /// `MAX_SCRIPT_PATH_SIZE`: the path buffer's size, NUL included.
    pub debugger_script_path_size: u64,
}

impl DebugOffsets {
    /// Reads and validates the debug offsets at `runtime_addr` (the address of the `_PyRuntime` symbol, or of
    /// the `.PyRuntime` ELF section). Checks the cookie ("xdebugpy"), that the version is 3.14 (a release or
    /// release candidate: the only layout known), that the values fit that layout, and that remote debugging
    /// is enabled in the target's main interpreter (`config.remote_debug == 1`).
    pub fn read(mem: &impl RemoteMemory, runtime_addr: u64) -> Result<Self, Pep768Error> {
        let offsets = Self::read_layout(mem, runtime_addr)?;
        let interp = offsets.main_interpreter(mem, runtime_addr)?;
        offsets.check_enabled(mem, interp)?;
        Ok(offsets)
    }

    /// The version as `3.14.0` / `3.14.0rc2`.
    fn version_string(&self) -> String {
        version_string(self.version)
    }

    /// Reads and checks the table only (no interpreter needed).
    fn read_layout(mem: &impl RemoteMemory, runtime_addr: u64) -> Result<Self, Pep768Error> {
        let mut cookie = [0u8; 8];
        mem.read(runtime_addr, &mut cookie)
            .map_err(|error| Pep768Error::Read {
                what: "the _Py_DebugOffsets cookie",
                addr: runtime_addr,
                error,
            })?;
        if &cookie != COOKIE {
            return Err(Pep768Error::BadCookie {
                addr: runtime_addr,
                found: cookie,
            });
        }
        let version = read_u64(mem, runtime_addr + at::VERSION, "the CPython version")?;
        let text = version_string(version);
        let (major, minor) = ((version >> 24) & 0xff, (version >> 16) & 0xff);
        if major != 3 || minor < 14 {
            return Err(Pep768Error::TooOld { version: text });
        }
        if minor > 14 {
            return Err(Pep768Error::UnknownLayout { version: text });
        }
        // Release level (PY_RELEASE_LEVEL): 0xA alpha, 0xB beta, 0xC candidate, 0xF final.
        if (version >> 4) & 0xf < 0xc {
            return Err(Pep768Error::PreRelease { version: text });
        }

        let mut table = vec![0u8; at::SIZE as usize];
        mem.read(runtime_addr, &mut table)
            .map_err(|error| Pep768Error::Read {
                what: "_Py_DebugOffsets",
                addr: runtime_addr,
                error,
            })?;
        let d = DebugOffsets314::from_bytes(&table).expect("read at::SIZE bytes");
        let offsets = Self {
            version,
            free_threaded: d.free_threaded,
            runtime_finalizing: d.runtime_state.finalizing,
            interpreters_head: d.runtime_state.interpreters_head,
            interp_size: d.interpreter_state.size,
            interp_id: d.interpreter_state.id,
            interp_next: d.interpreter_state.next,
            threads_main: d.interpreter_state.threads_main,
            remote_debugging_enabled: d.debugger_support.remote_debugging_enabled,
            tstate_size: d.thread_state.size,
            eval_breaker: d.debugger_support.eval_breaker,
            remote_debugger_support: d.debugger_support.remote_debugger_support,
            debugger_pending_call: d.debugger_support.debugger_pending_call,
            debugger_script_path: d.debugger_support.debugger_script_path,
            debugger_script_path_size: d.debugger_support.debugger_script_path_size,
        };
        offsets.check_layout(d.runtime_state.size)?;
        Ok(offsets)
    }

    /// Every offset must land inside the struct it indexes: a table of another layout (a patched or
    /// pre-release build) fails this long before it could make us write to a wrong place.
    fn check_layout(&self, runtime_size: u64) -> Result<(), Pep768Error> {
        let fits = |offset: u64, len: u64, size: u64| {
            offset.checked_add(len).is_some_and(|end| end <= size)
        };
        let support = self.remote_debugger_support;
        let checks: [(bool, &str); 9] = [
            (self.free_threaded <= 1, "free_threaded is neither 0 nor 1"),
            (
                fits(self.runtime_finalizing, 8, runtime_size),
                "runtime_state.finalizing is outside _PyRuntimeState",
            ),
            (
                fits(self.interpreters_head, 8, runtime_size),
                "runtime_state.interpreters_head is outside _PyRuntimeState",
            ),
            (
                fits(self.interp_id, 8, self.interp_size)
                    && fits(self.interp_next, 8, self.interp_size)
                    && fits(self.threads_main, 8, self.interp_size),
                "an interpreter_state offset is outside PyInterpreterState",
            ),
            (
                fits(self.remote_debugging_enabled, 4, self.interp_size),
                "debugger_support.remote_debugging_enabled is outside PyInterpreterState",
            ),
            (
                (2..=65536).contains(&self.debugger_script_path_size),
                "debugger_script_path_size is not a plausible buffer size",
            ),
            (
                fits(self.eval_breaker, 8, self.tstate_size),
                "debugger_support.eval_breaker is outside PyThreadState",
            ),
            (
                support
                    .checked_add(self.debugger_pending_call)
                    .is_some_and(|o| fits(o, 4, self.tstate_size)),
                "debugger_pending_call is outside PyThreadState",
            ),
            (
                support
                    .checked_add(self.debugger_script_path)
                    .is_some_and(|o| fits(o, self.debugger_script_path_size, self.tstate_size)),
                "debugger_script_path is outside PyThreadState",
            ),
        ];
        match checks.iter().find(|(ok, _)| !ok) {
            Some((_, detail)) => Err(Pep768Error::LayoutMismatch {
                version: self.version_string(),
                detail: (*detail).to_string(),
            }),
            None => Ok(()),
        }
    }

    /// The main interpreter (id 0): CPython's `sys.remote_exec` takes the list head, which is the same
    /// interpreter unless the target created sub-interpreters (they are pushed in front of it).
    fn main_interpreter(
        &self,
        mem: &impl RemoteMemory,
        runtime_addr: u64,
    ) -> Result<u64, Pep768Error> {
        if read_u64(
            mem,
            runtime_addr + self.runtime_finalizing,
            "_PyRuntime._finalizing",
        )? != 0
        {
            return Err(Pep768Error::Finalizing);
        }
        let mut interp = read_u64(
            mem,
            runtime_addr + self.interpreters_head,
            "_PyRuntime.interpreters.head",
        )?;
        for _ in 0..MAX_INTERPRETERS {
            if interp == 0 {
                break;
            }
            if read_u64(mem, interp + self.interp_id, "PyInterpreterState.id")? == 0 {
                return Ok(interp);
            }
            interp = read_u64(mem, interp + self.interp_next, "PyInterpreterState.next")?;
        }
        Err(Pep768Error::NoInterpreter)
    }

    /// `config.remote_debug` must be exactly 1, as both ends of CPython check.
    fn check_enabled(&self, mem: &impl RemoteMemory, interp: u64) -> Result<(), Pep768Error> {
        let value = read_i32(
            mem,
            interp + self.remote_debugging_enabled,
            "PyInterpreterState.config.remote_debug",
        )?;
        if value != 1 {
            return Err(Pep768Error::Disabled { value });
        }
        Ok(())
    }

    /// `&tstate->remote_debugger_support.debugger_pending_call`.
    fn pending_addr(&self, tstate: u64) -> u64 {
        tstate + self.remote_debugger_support + self.debugger_pending_call
    }

    /// `&tstate->remote_debugger_support.debugger_script_path[0]`.
    fn path_addr(&self, tstate: u64) -> u64 {
        tstate + self.remote_debugger_support + self.debugger_script_path
    }
}

/// Writes `script_path` (absolute, as the target sees it, NUL-terminated, must fit the buffer, else error)
/// into the remote-debugger fields of the main thread of the target's main interpreter, sets the pending-call
/// flag, then sets `_PY_EVAL_PLEASE_STOP_BIT` in that thread's eval breaker so the interpreter runs the file
/// at its next safe point. Returns the thread-state address used (for [`is_pending`] and [`cancel`]).
///
/// A request already pending in that thread (another debugger's) is replaced, as `sys.remote_exec` does.
pub fn request_script(
    mem: &impl RemoteMemory,
    runtime_addr: u64,
    script_path: &str,
) -> Result<u64, Pep768Error> {
    if !script_path.starts_with('/') {
        return Err(Pep768Error::PathNotAbsolute {
            path: script_path.to_string(),
        });
    }
    if script_path.contains('\0') {
        return Err(Pep768Error::PathHasNul {
            path: script_path.to_string(),
        });
    }
    let offsets = DebugOffsets::read_layout(mem, runtime_addr)?;
    if script_path.len() as u64 >= offsets.debugger_script_path_size {
        return Err(Pep768Error::PathTooLong {
            len: script_path.len(),
            size: offsets.debugger_script_path_size,
        });
    }
    let interp = offsets.main_interpreter(mem, runtime_addr)?;
    offsets.check_enabled(mem, interp)?;
    let tstate = read_u64(
        mem,
        interp + offsets.threads_main,
        "PyInterpreterState.threads.main",
    )?;
    if tstate == 0 {
        return Err(Pep768Error::NoMainThread { interp });
    }

    // Same order as CPython: the path, then the flag, then the breaker, so the thread never sees the flag
    // without the path.
    let mut path = Vec::with_capacity(script_path.len() + 1);
    path.extend_from_slice(script_path.as_bytes());
    path.push(0);
    set_request(mem, &offsets, tstate, &path, 1)?;

    // The target updates eval_breaker with atomic ORs/ANDs; from outside only a read-modify-write is
    // possible, as in CPython. Skipping the write when the bit is already set narrows the window in which a
    // bit the target sets meanwhile could be lost (a lost GIL-drop request is re-sent by its waiter).
    let breaker_addr = tstate + offsets.eval_breaker;
    let breaker = read_u64(mem, breaker_addr, "PyThreadState.eval_breaker")?;
    if breaker & EVAL_PLEASE_STOP_BIT == 0 {
        write(
            mem,
            breaker_addr,
            &(breaker | EVAL_PLEASE_STOP_BIT).to_le_bytes(),
            "PyThreadState.eval_breaker",
        )?;
    }
    Ok(tstate)
}

/// True while the target has not yet picked up the request (pending flag still set) — used to wait/cancel.
pub fn is_pending(
    mem: &impl RemoteMemory,
    runtime_addr: u64,
    tstate: u64,
) -> Result<bool, Pep768Error> {
    let offsets = DebugOffsets::read_layout(mem, runtime_addr)?;
    pending_in(mem, &offsets, tstate)
}

fn pending_in(
    mem: &impl RemoteMemory,
    offsets: &DebugOffsets,
    tstate: u64,
) -> Result<bool, Pep768Error> {
    if tstate == 0 {
        return Err(Pep768Error::NullThreadState);
    }
    let pending = read_i32(
        mem,
        offsets.pending_addr(tstate),
        "remote_debugger_support.debugger_pending_call",
    )?;
    Ok(pending != 0)
}

/// Clears a request that was not picked up yet (pending flag back to 0); returns whether it was still
/// pending. The path's first byte is cleared first, so a thread that takes the request between our read and
/// our write finds an empty path, which CPython skips. A thread that had already copied the path still runs
/// it: `true` means "pending when looked at", not "certainly not run".
pub fn cancel(
    mem: &impl RemoteMemory,
    runtime_addr: u64,
    tstate: u64,
) -> Result<bool, Pep768Error> {
    let offsets = DebugOffsets::read_layout(mem, runtime_addr)?;
    if !pending_in(mem, &offsets, tstate)? {
        return Ok(false);
    }
    set_request(mem, &offsets, tstate, &[0], 0)?;
    Ok(true)
}

/// Writes the script path's bytes, then the pending-call flag, in that order: the thread never
/// sees the flag set without its path, and a cleared path (one NUL) is skipped by CPython.
fn set_request(
    mem: &impl RemoteMemory,
    offsets: &DebugOffsets,
    tstate: u64,
    path: &[u8],
    pending: i32,
) -> Result<(), Pep768Error> {
    write(
        mem,
        offsets.path_addr(tstate),
        path,
        "the script path (remote_debugger_support.debugger_script_path)",
    )?;
    write(
        mem,
        offsets.pending_addr(tstate),
        &pending.to_le_bytes(),
        "remote_debugger_support.debugger_pending_call",
    )
}

fn write(
    mem: &impl RemoteMemory,
    addr: u64,
    data: &[u8],
    what: &'static str,
) -> Result<(), Pep768Error> {
    mem.write(addr, data)
        .map_err(|error| Pep768Error::Write { what, addr, error })
}

fn read_u64(mem: &impl RemoteMemory, addr: u64, what: &'static str) -> Result<u64, Pep768Error> {
    mem.read_u64(addr)
        .map_err(|error| Pep768Error::Read { what, addr, error })
}

fn read_i32(mem: &impl RemoteMemory, addr: u64, what: &'static str) -> Result<i32, Pep768Error> {
    mem.read_u32(addr)
        .map(|v| v as i32)
        .map_err(|error| Pep768Error::Read { what, addr, error })
}

/// `PY_VERSION_HEX` as text: `0x030E00F0` → `3.14.0`, `0x030E00C2` → `3.14.0rc2`.
fn version_string(hex: u64) -> String {
    let (major, minor, micro) = ((hex >> 24) & 0xff, (hex >> 16) & 0xff, (hex >> 8) & 0xff);
    let serial = hex & 0xf;
    let level = match (hex >> 4) & 0xf {
        0xa => "a",
        0xb => "b",
        0xc => "rc",
        _ => return format!("{major}.{minor}.{micro}"),
    };
    format!("{major}.{minor}.{micro}{level}{serial}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::BufferMemory;

    const BASE: u64 = 0x7f00_0000_0000;
    /// Where things live in the synthetic image, relative to `BASE` (= `_PyRuntime`).
    const RUNTIME_SIZE: u64 = 0x1000;
    const FINALIZING: u64 = 0x800;
    const INTERP_HEAD: u64 = 0x808;
    const INTERP: u64 = 0x2000;
    const SUBINTERP: u64 = 0x3000;
    const TSTATE: u64 = 0x4000;
    /// Offsets inside the synthetic structs (what the table says).
    const INTERP_SIZE: u64 = 0x800;
    const ID: u64 = 0x10;
    const NEXT: u64 = 0x18;
    const THREADS_MAIN: u64 = 0x28;
    const REMOTE_DEBUG: u64 = 0x400;
    const TSTATE_SIZE: u64 = 0x600;
    const EVAL_BREAKER: u64 = 0x40;
    const SUPPORT: u64 = 0x200;
    const PENDING: u64 = 0;
    const PATH: u64 = 4;
    const PATH_SIZE: u64 = 512;

    /// A `_PyRuntime` whose debug offsets follow the 3.14 layout, with one interpreter (id 0,
    /// remote debugging on) whose main thread state is at `TSTATE`.
    fn image() -> BufferMemory {
        let mem = BufferMemory {
            base: BASE,
            bytes: std::cell::RefCell::new(vec![0u8; 0x5000]),
        };
        mem.write(BASE, COOKIE).unwrap();
        let table = [
            (at::VERSION, 0x030E_01F0), // 3.14.1 final
            (at::FREE_THREADED, 0),
            (at::RUNTIME_SIZE, RUNTIME_SIZE),
            (at::RUNTIME_FINALIZING, FINALIZING),
            (at::RUNTIME_INTERPRETERS_HEAD, INTERP_HEAD),
            (at::INTERP_SIZE, INTERP_SIZE),
            (at::INTERP_ID, ID),
            (at::INTERP_NEXT, NEXT),
            (at::INTERP_THREADS_MAIN, THREADS_MAIN),
            (at::TSTATE_SIZE, TSTATE_SIZE),
            (at::EVAL_BREAKER, EVAL_BREAKER),
            (at::REMOTE_DEBUGGER_SUPPORT, SUPPORT),
            (at::REMOTE_DEBUGGING_ENABLED, REMOTE_DEBUG),
            (at::DEBUGGER_PENDING_CALL, PENDING),
            (at::DEBUGGER_SCRIPT_PATH, PATH),
            (at::DEBUGGER_SCRIPT_PATH_SIZE, PATH_SIZE),
        ];
        for (pos, value) in table {
            put_u64(&mem, BASE + pos, value);
        }
        put_u64(&mem, BASE + INTERP_HEAD, BASE + INTERP);
        put_u64(&mem, BASE + INTERP + ID, 0);
        put_u64(&mem, BASE + INTERP + THREADS_MAIN, BASE + TSTATE);
        put_i32(&mem, BASE + INTERP + REMOTE_DEBUG, 1);
        // Some unrelated bits already in the breaker: GIL drop request and an instrumentation version.
        put_u64(&mem, BASE + TSTATE + EVAL_BREAKER, (3 << 8) | 1);
        mem
    }

    fn put_u64(mem: &BufferMemory, addr: u64, value: u64) {
        mem.write(addr, &value.to_le_bytes()).unwrap();
    }

    fn put_i32(mem: &BufferMemory, addr: u64, value: i32) {
        mem.write(addr, &value.to_le_bytes()).unwrap();
    }

    fn pending_flag(mem: &BufferMemory) -> u32 {
        mem.read_u32(BASE + TSTATE + SUPPORT + PENDING).unwrap()
    }

    fn path_bytes(mem: &BufferMemory, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read(BASE + TSTATE + SUPPORT + PATH, &mut buf).unwrap();
        buf
    }

    #[test]
    fn read_accepts_a_3_14_runtime() {
        let mem = image();
        let o = DebugOffsets::read(&mem, BASE).unwrap();
        assert_eq!(o.version_string(), "3.14.1");
        assert_eq!(o.interpreters_head, INTERP_HEAD);
        assert_eq!(o.threads_main, THREADS_MAIN);
        assert_eq!(o.eval_breaker, EVAL_BREAKER);
        assert_eq!(o.remote_debugger_support, SUPPORT);
        assert_eq!(o.debugger_pending_call, PENDING);
        assert_eq!(o.debugger_script_path, PATH);
        assert_eq!(o.debugger_script_path_size, PATH_SIZE);
        assert_eq!(o.remote_debugging_enabled, REMOTE_DEBUG);
        // A release candidate and the free-threaded build are accepted too.
        put_u64(&mem, BASE + at::VERSION, 0x030E_00C3);
        put_u64(&mem, BASE + at::FREE_THREADED, 1);
        let o = DebugOffsets::read(&mem, BASE).unwrap();
        assert_eq!(o.version_string(), "3.14.0rc3");
        assert_eq!(o.free_threaded, 1);
    }

    #[test]
    fn read_rejects_a_wrong_cookie() {
        let mem = image();
        mem.write(BASE, b"xdebugpz").unwrap();
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(
            matches!(err, Pep768Error::BadCookie { addr: BASE, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("_PyRuntime"), "{err}");
    }

    #[test]
    fn read_rejects_other_versions() {
        let mem = image();
        put_u64(&mem, BASE + at::VERSION, 0x030D_05F0);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(
            matches!(&err, Pep768Error::TooOld { version } if version == "3.13.5"),
            "{err}"
        );
        assert!(err.to_string().contains("3.14+"), "{err}");

        put_u64(&mem, BASE + at::VERSION, 0x030F_00F0);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(matches!(err, Pep768Error::UnknownLayout { .. }), "{err}");

        put_u64(&mem, BASE + at::VERSION, 0x030E_00A7);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(
            matches!(&err, Pep768Error::PreRelease { version } if version == "3.14.0a7"),
            "{err}"
        );

        put_u64(&mem, BASE + at::VERSION, 0x020E_00F0);
        assert!(matches!(
            DebugOffsets::read(&mem, BASE),
            Err(Pep768Error::TooOld { .. })
        ));
    }

    #[test]
    fn read_rejects_a_table_of_another_layout() {
        let mem = image();
        put_u64(&mem, BASE + at::DEBUGGER_SCRIPT_PATH_SIZE, 0);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(matches!(err, Pep768Error::LayoutMismatch { .. }), "{err}");

        let mem = image();
        put_u64(&mem, BASE + at::REMOTE_DEBUGGER_SUPPORT, TSTATE_SIZE - 100);
        let err = request_script(&mem, BASE, "/tmp/x.py").unwrap_err();
        assert!(
            err.to_string().contains("debugger_script_path is outside"),
            "{err}"
        );
        assert_eq!(pending_flag(&mem), 0);
    }

    #[test]
    fn request_script_writes_path_then_flag_then_breaker_bit() {
        let mem = image();
        let path = "/proc/self/root/tmp/stallscope-probe-1234.py";
        let tstate = request_script(&mem, BASE, path).unwrap();
        assert_eq!(tstate, BASE + TSTATE);
        let mut expected = path.as_bytes().to_vec();
        expected.push(0);
        assert_eq!(path_bytes(&mem, expected.len()), expected);
        assert_eq!(pending_flag(&mem), 1);
        let breaker = mem.read_u64(BASE + TSTATE + EVAL_BREAKER).unwrap();
        assert_eq!(breaker, (3 << 8) | 1 | EVAL_PLEASE_STOP_BIT);
        assert_eq!(EVAL_PLEASE_STOP_BIT, 0x20);
        assert!(is_pending(&mem, BASE, tstate).unwrap());
        // The target picks it up: it clears the flag.
        put_i32(&mem, BASE + TSTATE + SUPPORT + PENDING, 0);
        assert!(!is_pending(&mem, BASE, tstate).unwrap());
    }

    #[test]
    fn request_script_checks_the_path() {
        let mem = image();
        let longest = format!("/{}", "a".repeat(PATH_SIZE as usize - 2));
        assert_eq!(longest.len() as u64, PATH_SIZE - 1);
        let too_long = format!("{longest}b");
        let err = request_script(&mem, BASE, &too_long).unwrap_err();
        assert!(
            matches!(
                err,
                Pep768Error::PathTooLong {
                    len: 512,
                    size: 512
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("holds 511"), "{err}");
        assert_eq!(pending_flag(&mem), 0);
        assert_eq!(path_bytes(&mem, 1), [0]);

        for bad in ["", "tmp/x.py", "./x.py"] {
            let err = request_script(&mem, BASE, bad).unwrap_err();
            assert!(matches!(err, Pep768Error::PathNotAbsolute { .. }), "{err}");
        }
        let err = request_script(&mem, BASE, "/tmp/a\0b.py").unwrap_err();
        assert!(matches!(err, Pep768Error::PathHasNul { .. }), "{err}");
        assert_eq!(pending_flag(&mem), 0);

        request_script(&mem, BASE, &longest).unwrap();
        let buf = path_bytes(&mem, PATH_SIZE as usize);
        assert_eq!(&buf[..longest.len()], longest.as_bytes());
        assert_eq!(buf[longest.len()], 0);
    }

    #[test]
    fn cancel_clears_a_pending_request() {
        let mem = image();
        let tstate = request_script(&mem, BASE, "/tmp/probe.py").unwrap();
        assert!(cancel(&mem, BASE, tstate).unwrap());
        assert_eq!(pending_flag(&mem), 0);
        assert_eq!(
            path_bytes(&mem, 1),
            [0],
            "a racing pickup finds an empty path"
        );
        assert!(!is_pending(&mem, BASE, tstate).unwrap());
        // Nothing left to cancel.
        assert!(!cancel(&mem, BASE, tstate).unwrap());
        assert!(matches!(
            cancel(&mem, BASE, 0),
            Err(Pep768Error::NullThreadState)
        ));
    }

    #[test]
    fn cancel_after_pickup_leaves_the_thread_alone() {
        let mem = image();
        let tstate = request_script(&mem, BASE, "/tmp/probe.py").unwrap();
        put_i32(&mem, BASE + TSTATE + SUPPORT + PENDING, 0);
        assert!(!cancel(&mem, BASE, tstate).unwrap());
        assert_eq!(path_bytes(&mem, 4), *b"/tmp");
    }

    #[test]
    fn disabled_remote_debugging_is_a_clear_error() {
        let mem = image();
        put_i32(&mem, BASE + INTERP + REMOTE_DEBUG, 0);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(matches!(err, Pep768Error::Disabled { value: 0 }), "{err}");
        let text = err.to_string();
        assert!(text.contains("PYTHON_DISABLE_REMOTE_DEBUG"), "{text}");
        assert!(text.contains("-X disable-remote-debug"), "{text}");
        let err = request_script(&mem, BASE, "/tmp/probe.py").unwrap_err();
        assert!(matches!(err, Pep768Error::Disabled { .. }), "{err}");
        assert_eq!(pending_flag(&mem), 0);
        assert_eq!(path_bytes(&mem, 1), [0]);
        let breaker = mem.read_u64(BASE + TSTATE + EVAL_BREAKER).unwrap();
        assert_eq!(breaker & EVAL_PLEASE_STOP_BIT, 0);
    }

    #[test]
    fn a_sub_interpreter_at_the_list_head_is_skipped() {
        let mem = image();
        // A sub-interpreter (id 1) created later sits at the head, linking to the main one.
        put_u64(&mem, BASE + INTERP_HEAD, BASE + SUBINTERP);
        put_u64(&mem, BASE + SUBINTERP + ID, 1);
        put_u64(&mem, BASE + SUBINTERP + NEXT, BASE + INTERP);
        put_u64(&mem, BASE + SUBINTERP + THREADS_MAIN, BASE + 0x4800);
        assert_eq!(
            request_script(&mem, BASE, "/tmp/probe.py").unwrap(),
            BASE + TSTATE
        );
    }

    #[test]
    fn missing_interpreter_main_thread_or_finalizing_runtime_are_errors() {
        let mem = image();
        put_u64(&mem, BASE + INTERP + THREADS_MAIN, 0);
        let err = request_script(&mem, BASE, "/tmp/probe.py").unwrap_err();
        assert!(matches!(err, Pep768Error::NoMainThread { .. }), "{err}");

        let mem = image();
        put_u64(&mem, BASE + INTERP_HEAD, 0);
        let err = DebugOffsets::read(&mem, BASE).unwrap_err();
        assert!(matches!(err, Pep768Error::NoInterpreter), "{err}");

        let mem = image();
        put_u64(&mem, BASE + FINALIZING, BASE + TSTATE);
        let err = request_script(&mem, BASE, "/tmp/probe.py").unwrap_err();
        assert!(matches!(err, Pep768Error::Finalizing), "{err}");
    }

    #[test]
    fn unreadable_memory_names_what_was_read() {
        let mem = image();
        let err = DebugOffsets::read(&mem, 0x1000).unwrap_err();
        assert!(
            matches!(err, Pep768Error::Read { addr: 0x1000, .. }),
            "{err}"
        );
        assert!(std::error::Error::source(&err).is_some());
        assert!(err.to_string().contains("CAP_SYS_PTRACE"), "{err}");
    }

    #[test]
    fn versions_print_like_python() {
        assert_eq!(version_string(0x030E_00F0), "3.14.0");
        assert_eq!(version_string(0x030E_00B2), "3.14.0b2");
        assert_eq!(version_string(0x030D_07F0), "3.13.7");
    }
}
