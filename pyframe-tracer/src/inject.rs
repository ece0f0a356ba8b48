//! Running Python source inside a live interpreter at a safe point.
//!
//! CPython 3.10–3.13: a borrowed thread maps one anonymous region, the source (one line) is written into it,
//! and `Py_AddPendingCall(PyRun_SimpleString, region)` queues it; the main thread runs it at its next eval-loop
//! safe point, holding the GIL. The probe unmaps the region itself once it runs.
//! CPython 3.14+: PEP 768 — the line goes into a script file the target can read, and the main thread state's
//! remote-debugger fields ask the interpreter to run it; no ptrace at all. A 3.14 whose owner turned PEP 768
//! off (PYTHON_DISABLE_REMOTE_DEBUG, -X disable-remote-debug) gets the pending call instead.
//! Either way a request that is not picked up in time is cancelled, so the target never runs a stale request:
//! before 3.14 the region holds `if 1: REQUEST` / `else: UNMAP`, and a cancel turns the `1` into `0` (one byte,
//! so the interpreter reads either whole), which leaves only the region's own unmapping to run; PEP 768's
//! pending flag is cleared.

use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::memory::{ProcessMemory, RemoteMemory};
use crate::pep768;
use crate::python::PythonRuntime;
use crate::remote_call::Options;
use crate::symbols;
use crate::transaction;

const PAGE: u64 = 4096;

/// A queued request, to wait for or cancel.
#[derive(Debug)]
pub enum Queued {
    /// A pending call reading this region.
    PendingCall {
        /// Address of the region in the target.
        region: u64,
    },
    /// A PEP 768 request on this thread state.
    Pep768 {
        /// Thread state address.
        tstate: u64,
        /// Script file, as this process sees it.
        script: std::path::PathBuf,
    },
}

/// What queuing cost the target.
#[derive(Debug, Clone, Copy, Default)]
pub struct QueueCost {
    /// How long one of its threads was stopped (zero for PEP 768).
    pub pause: Duration,
}

/// Queues Python source for the target's main thread. `build(page)` returns the single-line
/// source given `page`, a Python expression for the `(address, size)` of the memory it will
/// live in, which the source unmaps once it has run (`(0, 0)` where there is none, on 3.14+);
/// `script` is the path, as the target sees it, where 3.14+ reads the source from.
pub fn queue(
    pid: i32,
    rt: &PythonRuntime,
    options: Options,
    script: &str,
    build: impl Fn(&str) -> String,
) -> Result<(Queued, QueueCost)> {
    check_running(pid)?;
    let queued = match rt.delivery() {
        crate::python::Delivery::Pep768 => match queue_script(pid, rt, script, &build) {
            // The target's owner turned PEP 768 off; the ptrace route still reaches it.
            Err(Error::Pep768(pep768::Pep768Error::Disabled { .. }))
                if rt.run_simple_string.is_some() =>
            {
                queue_pending_call(pid, rt, options, &build)
            }
            other => other,
        },
        crate::python::Delivery::PendingCall => queue_pending_call(pid, rt, options, &build),
    };
    // A target that exits midway makes its maps, symbols or memory unreadable: say that it
    // exited rather than what could not be read.
    queued.map_err(|e| match check_running(pid) {
        Err(Error::TargetExited(_) | Error::NoSuchProcess(_)) => Error::TargetExited(pid),
        _ => e,
    })
}

/// 3.14+: writes the source to `script` (inside the target's root) and asks the interpreter
/// to run it at its next safe point (PEP 768); the target's threads are never stopped.
fn queue_script(
    pid: i32,
    rt: &PythonRuntime,
    script: &str,
    build: impl Fn(&str) -> String,
) -> Result<(Queued, QueueCost)> {
    let line = build(&page_expr(0, 0));
    let host = std::path::PathBuf::from(format!("/proc/{pid}/root{script}"));
    std::fs::write(&host, line.as_bytes())
        .map_err(|e| Error::io(format!("writing {}", host.display()), e))?;
    let runtime = rt
        .py_runtime
        .expect("python::find checks _PyRuntime on 3.14+");
    let tstate =
        pep768::request_script(&ProcessMemory::new(pid), runtime, script).map_err(|e| {
            let _ = std::fs::remove_file(&host);
            Error::from(e)
        })?;
    Ok((
        Queued::Pep768 {
            tstate,
            script: host,
        },
        QueueCost::default(),
    ))
}

/// Before 3.14: maps a region in the target for the source and queues
/// `PyRun_SimpleString(region)` with `Py_AddPendingCall`, from a borrowed thread, in one
/// [`transaction`]. The source is built before the thread is borrowed, with a placeholder of
/// the region's expression's length; the hold only writes the region's address into it.
fn queue_pending_call(
    pid: i32,
    rt: &PythonRuntime,
    options: Options,
    build: impl Fn(&str) -> String,
) -> Result<(Queued, QueueCost)> {
    let libc = libc_symbol(pid, "mmap")?;
    let mut source = Source::new(&build);
    let size = source.size();
    let done = transaction::run(pid, options, move |thread| {
        let prot = (libc::PROT_READ | libc::PROT_WRITE) as u64;
        let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
        let region = thread.call(libc, &[0, size, prot, flags, u64::MAX, 0])?;
        if region as i64 <= 0 && (region as i64) > -4096 {
            return Err(Error::RemoteCallFailed {
                pid,
                what: format!("mmap in the target failed ({})", -(region as i64)),
            });
        }
        ProcessMemory::new(pid)
            .write(region, source.at(region))
            .map_err(|e| Error::io("writing the request into the target", e))?;
        let queued = thread.call(
            rt.add_pending_call,
            &[rt.run_simple_string.unwrap_or_default(), region],
        )?;
        Ok((region, queued))
    })?;
    let (region, queued) = done.value;
    if queued as i32 != 0 {
        return Err(Error::Probe(format!(
            "Py_AddPendingCall refused the request in process {pid} (its queue is full); retry"
        )));
    }
    Ok((
        Queued::PendingCall { region },
        QueueCost { pause: done.pause },
    ))
}

/// Where [`guarded`] puts the byte a cancel turns from `1` to `0`.
const CANCEL_AT: u64 = 3;

/// A pending call's source, NUL-terminated, built before the region it will live in exists.
struct Source {
    text: Vec<u8>,
    /// Where the placeholder for the region's expression stands.
    spots: Vec<usize>,
}

impl Source {
    fn new(build: &impl Fn(&str) -> String) -> Source {
        let placeholder = page_expr(u64::MAX, u64::MAX);
        let text = guarded(build, &placeholder);
        // The placeholder occurs nowhere else: base64 and the wrappers' fixed text hold no `(0x`.
        let spots = text.match_indices(&placeholder).map(|(at, _)| at).collect();
        let mut text = text.into_bytes();
        text.push(0);
        Source { text, spots }
    }

    /// The size of the region it needs: whole pages.
    fn size(&self) -> u64 {
        (self.text.len() as u64).div_ceil(PAGE) * PAGE
    }

    /// The source that lives at `region`.
    fn at(&mut self, region: u64) -> &[u8] {
        let page = page_expr(region, self.size());
        for &at in &self.spots {
            self.text[at..at + page.len()].copy_from_slice(page.as_bytes());
        }
        &self.text
    }
}

/// The Python expression for a region's `(address, size)`: the same length for every value,
/// so a source built around a placeholder takes the real one in place.
fn page_expr(address: u64, size: u64) -> String {
    format!("(0x{address:016x},0x{size:016x})")
}

/// The source a pending call runs from the region `page` names: the request while it stands,
/// else only the region's unmapping (the request unmaps the region itself when it runs).
fn guarded(build: &impl Fn(&str) -> String, page: &str) -> String {
    let text = format!(
        "if 1: {}\nelse: import ctypes as _c;_l=_c.CDLL(None);_l.munmap.argtypes=[_c.c_void_p,_c.c_size_t];_p={page};_l.munmap(_c.c_void_p(_p[0]),_c.c_size_t(_p[1]))",
        build(page)
    );
    debug_assert_eq!(&text.as_bytes()[CANCEL_AT as usize..][..1], b"1");
    text
}

/// Waits until `done()` reports the request ran; cancels it on timeout.
pub fn wait<T>(
    pid: i32,
    queued: &Queued,
    timeout: Duration,
    mut done: impl FnMut() -> Option<T>,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = done() {
            return Ok(v);
        }
        if let Err(Error::TargetExited(_) | Error::NoSuchProcess(_)) = check_running(pid) {
            return Err(Error::TargetExited(pid));
        }
        if Instant::now() >= deadline {
            cancel(pid, queued);
            // It may have run while we cancelled.
            return done().ok_or(Error::NotAtSafePoint {
                pid,
                ms: timeout.as_millis() as u64,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn cancel(pid: i32, queued: &Queued) {
    let mem = ProcessMemory::new(pid);
    match queued {
        Queued::PendingCall { region } => {
            let _ = mem.write(*region + CANCEL_AT, b"0");
        }
        Queued::Pep768 { tstate, script } => {
            let _ = std::fs::remove_file(script);
            if let Ok(rt) = crate::python::find(pid) {
                let _ = pep768::cancel(&mem, rt.py_runtime.unwrap_or_default(), *tstate);
            }
        }
    }
}

/// The kernel's "getting shut down" task flag (`PF_EXITING`, include/linux/sched.h), in the
/// flags field of `/proc/PID/stat`.
const PF_EXITING: u64 = 0x4;

/// A stopped target cannot reach a safe point, and a zombie or a process on its way out (its
/// memory may already be gone) has exited; say so instead of timing out.
fn check_running(pid: i32) -> Result<()> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map_err(|_| Error::NoSuchProcess(pid))?;
    let fields = sys_util::task_state::stat_fields(&stat);
    let exiting = fields
        .get(6)
        .and_then(|f| f.parse::<u64>().ok())
        .is_some_and(|f| f & PF_EXITING != 0);
    match fields.first().copied().unwrap_or("") {
        "Z" | "X" => Err(Error::TargetExited(pid)),
        _ if exiting => Err(Error::TargetExited(pid)),
        "T" | "t" => Err(Error::TargetStopped(pid)),
        _ => Ok(()),
    }
}

/// Address of a libc function in the target (libc.so, else the executable for static builds).
fn libc_symbol(pid: i32, name: &str) -> Result<u64> {
    let mappings = crate::maps::read(pid)
        .map_err(|e| crate::python::gone_or(pid, e, "reading its memory map"))?;
    let is_libc = |m: &crate::maps::Mapping| {
        let f = m.file_name();
        f.starts_with("libc.so") || f.starts_with("libc-") || f.starts_with("ld-musl")
    };
    for filter in [
        Box::new(is_libc) as Box<dyn Fn(&crate::maps::Mapping) -> bool>,
        Box::new(|m: &crate::maps::Mapping| m.file_name().contains("python")),
    ] {
        if let Ok(Some(module)) = symbols::load_module(pid, &mappings, filter) {
            if let Some(addr) = module.symbol(name) {
                return Ok(addr);
            }
        }
    }
    Err(Error::MissingSymbol {
        pid,
        symbol: name.into(),
    })
}

/// Wrapper the target runs around [`run_source`]'s code: runs it in a fresh namespace, writes
/// the outcome to a marker file (renamed into place, so it is never read half-written), and
/// unmaps the request's region (`_PAGE`, its `(address, size)`; address 0 on 3.14+, where
/// there is none).
const RUN_WRAPPER: &str = r#"import os as _os
try:
    exec(compile(_SOURCE, '<stallscope>', 'exec'), {'__name__': '_stallscope_run'})
    _outcome = 'ok'
except BaseException as _e:
    _outcome = 'error: %s: %s' % (type(_e).__name__, _e)
with open(_MARK + '.partial', 'w') as _f:
    _f.write(_outcome)
_os.rename(_MARK + '.partial', _MARK)
if _PAGE[0]:
    import ctypes as _c
    _libc = _c.CDLL(None)
    _libc.munmap.argtypes = [_c.c_void_p, _c.c_size_t]
    _libc.munmap(_c.c_void_p(_PAGE[0]), _c.c_size_t(_PAGE[1]))
"#;

/// Runs Python `source` (any number of lines) in the target's main thread at its next safe
/// point, holding the GIL, and waits until it has run (at most `timeout`; a request not
/// picked up by then is cancelled). An exception in `source` is returned as an error; it
/// never propagates into the target.
pub fn run_source(pid: i32, source: &str, timeout: Duration) -> Result<()> {
    let rt = crate::python::find(pid)?;
    let stamp = sys_util::clock::monotonic_ns();
    let mark = format!("/tmp/stallscope-run-{pid}-{stamp}.done");
    let host_mark = std::path::PathBuf::from(format!("/proc/{pid}/root{mark}"));
    let script = format!("/tmp/stallscope-run-{pid}-{stamp}.py");
    let prelude = format!(
        "_SOURCE = __import__('binascii').a2b_base64('{}').decode()\n_MARK = '{mark}'\n",
        crate::session::base64(source.as_bytes())
    );
    let wrapped = crate::session::base64(format!("{prelude}{RUN_WRAPPER}").as_bytes());
    let build = |page: &str| {
        format!("exec(__import__('binascii').a2b_base64('{wrapped}'),{{'_PAGE':{page}}})")
    };
    let (queued, _) = queue(pid, &rt, Options::default(), &script, build)?;
    let outcome = wait(pid, &queued, timeout, || {
        std::fs::read_to_string(&host_mark).ok()
    });
    let _ = std::fs::remove_file(&host_mark);
    let _ = std::fs::remove_file(format!("/proc/{pid}/root{script}"));
    match outcome?.as_str() {
        "ok" => Ok(()),
        other => Err(Error::Probe(format!(
            "the code run in process {pid} failed: {}",
            other.trim_start_matches("error: ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_source_built_ahead_names_its_region_as_one_built_for_it() {
        let build = |page: &str| format!("run({page}, '{}')", "x".repeat(5000));
        let mut source = Source::new(&build);
        assert_eq!(source.size(), 2 * PAGE);
        assert_eq!(
            source.spots.len(),
            2,
            "the request's and the cancel branch's"
        );
        let region = 0x7f12_3456_7000;
        let mut direct = guarded(&build, &page_expr(region, 2 * PAGE)).into_bytes();
        direct.push(0);
        assert_eq!(source.at(region), &direct[..]);
    }
}
