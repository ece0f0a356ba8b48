//! The Python probe's compiled half: the extension module `_stallscope_native`, which the
//! injected probe (`pyframe-tracer/src/probe.py`) loads into the target to time watched calls
//! and write their records into the ring. The probe keeps its pure-Python writer for targets
//! that cannot load it (a free-threaded build, a `noexec` /tmp, no library shipped).
//!
//! What runs here per watched call, instead of a Python function: the `sys.monitoring`
//! callbacks themselves (3.12+), or the object a code swap's trampoline calls (3.10, 3.11);
//! the clock, the thread's lane and the record's write. Extracting a call's arguments stays in
//! Python (the probe's extractor, called from here).
//!
//! # Invariants
//! Every entry point runs with the GIL held: CPython calls callbacks and objects with it, and
//! nothing here releases it. That serialises every writer of the ring in this process and
//! [`Writer::close`] against them, which is what makes the unsynchronised parts sound: the
//! mapping is unmapped only under the GIL, after which no write touches it. CPython never
//! unloads an extension module, so the library stays mapped once loaded; a later attach
//! reuses it (the probe finds it in `sys.modules`).

mod ring;

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;

use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use ring::{Ring, MAX_FIELDS};

/// Bumped when the module's interface to `probe.py` changes: a loaded module of another
/// version is not used (it cannot be replaced in a live process).
const VERSION: u32 = 1;

/// How often a record triggers the probe's lease check (ns).
const LEASE_CHECK_NS: u64 = 1_000_000_000;

/// Fields extracted from a call's arguments: the presence mask and the values.
type Fields = (u8, [i64; MAX_FIELDS]);

/// A watched call begun on this thread (`sys.monitoring`'s PY_START), ended by its PY_RETURN
/// or PY_UNWIND.
struct Begun {
    code: usize,
    probe: u32,
    t0: u64,
    fields: Option<Fields>,
}

/// This thread's state for one writer and one set of watches.
struct Thread {
    /// The writer's id and watch epoch this state belongs to.
    owner: (u64, u64),
    lane: usize,
    tid: u64,
    begun: Vec<Begun>,
}

thread_local! {
    static THREAD: RefCell<Option<Thread>> = const { RefCell::new(None) };
}

/// Distinguishes writers, so a thread's lane of an earlier ring is never reused.
static NEXT_WRITER: AtomicU64 = AtomicU64::new(1);

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_MONOTONIC always exists (the vDSO serves it).
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn gettid() -> u64 {
    // SAFETY: gettid has no arguments and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u64 }
}

/// A watched code object (by address: the probe holds the function, so the code lives), its
/// probe id and, when the watch reads arguments, the Python callable that extracts them from
/// the caller's frame.
struct Watch {
    code: usize,
    probe: u32,
    extract: Option<Py<PyAny>>,
}

/// The ring writer of one attach.
#[pyclass(frozen, module = "_stallscope_native")]
struct Writer {
    ring: Ring,
    id: u64,
    /// Bumped by `unwatch_all`: calls begun under earlier watches are forgotten.
    epoch: AtomicU64,
    next_lane: AtomicU32,
    next_check: AtomicU64,
    /// The probe's lease check, called with the time at most once a second.
    lease: Py<PyAny>,
    watches: Mutex<Vec<Watch>>,
    closed: AtomicBool,
}

impl Writer {
    fn owner(&self) -> (u64, u64) {
        (self.id, self.epoch.load(Ordering::Relaxed))
    }

    /// Runs `f` with this thread's state for this writer (claimed on first use); None when the
    /// state is busy (a call re-entered from inside this module) or the thread is exiting.
    fn with_thread<R>(&self, f: impl FnOnce(&mut Thread) -> R) -> Option<R> {
        THREAD
            .try_with(|cell| {
                let mut slot = cell.try_borrow_mut().ok()?;
                let owner = self.owner();
                if slot.as_ref().is_none_or(|t| t.owner.0 != owner.0) {
                    let lane = (self.next_lane.fetch_add(1, Ordering::Relaxed) as usize)
                        .min(self.ring.lanes() - 1);
                    let tid = gettid();
                    self.ring.claim(lane, tid);
                    *slot = Some(Thread {
                        owner,
                        lane,
                        tid,
                        begun: Vec::new(),
                    });
                }
                let t = slot.as_mut()?;
                if t.owner != owner {
                    t.owner = owner;
                    t.begun.clear();
                }
                Some(f(t))
            })
            .ok()
            .flatten()
    }

    /// Writes one record and, once a second, runs the probe's lease check. Nothing after the
    /// check touches the ring: it may have detached the probe and closed this writer.
    fn record(&self, py: Python<'_>, probe: u32, flags: u32, t0: u64, t1: u64, f: Option<&Fields>) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        let written = self.with_thread(|t| {
            let (mask, values) = f.map_or((0, None), |(m, v)| (*m, Some(v)));
            self.ring.put(
                t.lane,
                t.tid,
                probe,
                flags | u32::from(mask) << 8,
                t0,
                t1,
                values,
            )
        });
        if written.is_none() {
            self.ring.lose(self.ring.lanes() - 1);
        }
        if t1 >= self.next_check.load(Ordering::Relaxed) {
            self.next_check
                .store(t1 + LEASE_CHECK_NS, Ordering::Relaxed);
            // The probe's check never raises; an error here is dropped, not raised into the
            // target.
            let _ = self.lease.call1(py, (t1,));
        }
    }

    /// The watch of `code`, if it is one: (probe id, its extractor).
    fn lookup(&self, py: Python<'_>, code: usize) -> Option<(u32, Option<Py<PyAny>>)> {
        let watches = self.watches.lock().ok()?;
        let w = watches.iter().find(|w| w.code == code)?;
        Some((w.probe, w.extract.as_ref().map(|e| e.clone_ref(py))))
    }

    /// A PY_RETURN (`exc` false) or PY_UNWIND of `code`: pops the calls begun on this thread
    /// down to its own and writes its record.
    fn end(&self, py: Python<'_>, code: &Bound<'_, PyAny>, exc: bool) {
        let code = code.as_ptr() as usize;
        let t1 = monotonic_ns();
        let Some(Some(b)) = self.with_thread(|t| {
            while let Some(b) = t.begun.pop() {
                if b.code == code {
                    return Some(b);
                }
            }
            None
        }) else {
            return;
        };
        self.record(py, b.probe, u32::from(exc), b.t0, t1, b.fields.as_ref());
    }
}

/// The extractor's result, `None` or `(mask, [v0..v7])`, as fields.
fn fields_of(value: &Bound<'_, PyAny>) -> Option<Fields> {
    if value.is_none() {
        return None;
    }
    let (mask, values): (u8, Vec<i64>) = value.extract().ok()?;
    let mut out = [0i64; MAX_FIELDS];
    for (o, v) in out.iter_mut().zip(values) {
        *o = v;
    }
    Some((mask, out))
}

#[pymethods]
impl Writer {
    /// Maps the ring at `path` (made by stallscope, already mapped by the probe); `lease` is
    /// called with the time once a second.
    #[new]
    fn new(path: &str, lease: Py<PyAny>) -> PyResult<Writer> {
        let ring = Ring::open(path).map_err(|e| PyOSError::new_err(format!("{path}: {e}")))?;
        Ok(Writer {
            ring,
            id: NEXT_WRITER.fetch_add(1, Ordering::Relaxed),
            epoch: AtomicU64::new(0),
            next_lane: AtomicU32::new(0),
            next_check: AtomicU64::new(0),
            lease,
            watches: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
        })
    }

    /// One record from the probe's own paths (calls with arguments read, exceptions):
    /// `flags` bit 0 the exception, `fields` None or (mask, [v0..v7]).
    #[pyo3(signature = (probe, flags, t0, t1, fields=None))]
    fn write(
        &self,
        py: Python<'_>,
        probe: u32,
        flags: u32,
        t0: u64,
        t1: u64,
        fields: Option<&Bound<'_, PyAny>>,
    ) {
        let f = fields.and_then(fields_of);
        self.record(py, probe, flags & 1, t0, t1, f.as_ref());
    }

    /// Watches `code` (3.12+: its PY_START, PY_RETURN and PY_UNWIND reach the callbacks
    /// below) as `probe`; `extract()`, if given, returns the call's fields from its frame.
    #[pyo3(signature = (code, probe, extract=None))]
    fn watch(&self, code: &Bound<'_, PyAny>, probe: u32, extract: Option<Py<PyAny>>) {
        if let Ok(mut w) = self.watches.lock() {
            w.push(Watch {
                code: code.as_ptr() as usize,
                probe,
                extract,
            });
        }
    }

    /// Forgets every watch and the calls begun under them.
    fn unwatch_all(&self) {
        if let Ok(mut w) = self.watches.lock() {
            w.clear();
        }
        self.epoch.fetch_add(1, Ordering::Relaxed);
    }

    /// The PY_START callback.
    fn on_start(&self, py: Python<'_>, code: &Bound<'_, PyAny>, _offset: &Bound<'_, PyAny>) {
        let key = code.as_ptr() as usize;
        let Some((probe, extract)) = self.lookup(py, key) else {
            return;
        };
        // The extractor runs Python (attribute reads) before this thread's state is borrowed:
        // it may call another watched function.
        let fields = extract.and_then(|e| e.call0(py).ok().and_then(|v| fields_of(v.bind(py))));
        let t0 = monotonic_ns();
        self.with_thread(|t| {
            t.begun.push(Begun {
                code: key,
                probe,
                t0,
                fields,
            })
        });
    }

    /// The PY_RETURN callback.
    fn on_return(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        _offset: &Bound<'_, PyAny>,
        _value: &Bound<'_, PyAny>,
    ) {
        self.end(py, code, false);
    }

    /// The PY_UNWIND callback (every frame an exception leaves, watched or not).
    fn on_unwind(
        &self,
        py: Python<'_>,
        code: &Bound<'_, PyAny>,
        _offset: &Bound<'_, PyAny>,
        _exc: &Bound<'_, PyAny>,
    ) {
        // Unwinds reach here from every frame: a thread that never began a watched call gets
        // no lane for one.
        if self.lookup(py, code.as_ptr() as usize).is_some() {
            self.end(py, code, true);
        }
    }

    /// The object a code swap's trampoline calls as `hook(args, kwargs)` (3.10, 3.11): it
    /// calls `orig` and records the call as `probe`.
    fn hook(slf: Py<Self>, orig: Py<PyAny>, probe: u32) -> Hook {
        Hook {
            writer: slf,
            orig,
            probe,
        }
    }

    /// Stops writing and unmaps the ring.
    fn close(&self) {
        if !self.closed.swap(true, Ordering::Relaxed) {
            self.ring.unmap();
        }
    }
}

impl Drop for Writer {
    /// A writer the probe dropped without closing it (a replaced probe) unmaps its ring too.
    /// Python deallocates it holding the GIL, with no reference left to write through.
    fn drop(&mut self) {
        self.close();
    }
}

/// A watched function's stand-in for its trampoline (`probe.py`'s code swap and attribute
/// wrapper).
#[pyclass(frozen, module = "_stallscope_native")]
struct Hook {
    writer: Py<Writer>,
    orig: Py<PyAny>,
    probe: u32,
}

#[pymethods]
impl Hook {
    fn __call__(
        &self,
        py: Python<'_>,
        args: &Bound<'_, PyTuple>,
        kwargs: &Bound<'_, PyDict>,
    ) -> PyResult<Py<PyAny>> {
        let t0 = monotonic_ns();
        let result = self.orig.bind(py).call(args, Some(kwargs));
        let t1 = monotonic_ns();
        self.writer
            .get()
            .record(py, self.probe, u32::from(result.is_err()), t0, t1, None);
        result.map(Bound::unbind)
    }
}

#[pymodule]
#[pyo3(name = "_stallscope_native")]
fn stallscope_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("VERSION", VERSION)?;
    m.add_class::<Writer>()?;
    m.add_class::<Hook>()?;
    Ok(())
}
