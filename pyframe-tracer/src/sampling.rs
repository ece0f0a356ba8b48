//! Stack sampling for deep dives and hang dumps: py-spy as a library, in non-blocking mode (it reads the target's
//! memory while the target keeps running; a sample may occasionally be inconsistent, never a pause).

use serde::Serialize;

use crate::error::{Error, Result};

/// One Python frame.
#[derive(Debug, Clone, Serialize)]
pub struct Frame {
    /// Function name.
    pub func: String,
    /// Source file.
    pub file: String,
    /// Line number (0 when unknown).
    pub line: i32,
}

/// One thread's stack, innermost frame first.
#[derive(Debug, Clone, Serialize)]
pub struct ThreadStack {
    /// Native thread id, when py-spy could map it.
    pub tid: Option<u64>,
    /// Python thread name, if any.
    pub name: Option<String>,
    /// The thread was running (not idle in a wait) when sampled.
    pub active: bool,
    /// The thread held the GIL.
    pub owns_gil: bool,
    /// Frames, innermost first.
    pub frames: Vec<Frame>,
}

/// A sampler attached to one process.
pub struct Sampler {
    spy: py_spy::PythonSpy,
    pid: i32,
}

impl Sampler {
    /// Prepares sampling of `pid` (reads its interpreter layout once).
    pub fn new(pid: i32) -> Result<Sampler> {
        let config = py_spy::Config {
            blocking: py_spy::config::LockingStrategy::NonBlocking,
            include_idle: true,
            ..py_spy::Config::default()
        };
        let spy = py_spy::PythonSpy::new(pid, &config).map_err(|e| sampling_error(pid, e))?;
        Ok(Sampler { spy, pid })
    }

    /// Takes one sample of every Python thread.
    pub fn sample(&mut self) -> Result<Vec<ThreadStack>> {
        let traces = self
            .spy
            .get_stack_traces()
            .map_err(|e| sampling_error(self.pid, e))?;
        Ok(traces
            .into_iter()
            .map(|t| ThreadStack {
                tid: t.os_thread_id,
                name: t.thread_name,
                active: t.active,
                owns_gil: t.owns_gil,
                frames: t
                    .frames
                    .into_iter()
                    .map(|f| Frame {
                        func: f.name,
                        file: f.filename,
                        line: f.line,
                    })
                    .collect(),
            })
            .collect())
    }
}

fn sampling_error(pid: i32, e: impl std::fmt::Display) -> Error {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        return Error::NoSuchProcess(pid);
    }
    Error::Probe(format!(
        "sampling the Python stacks of process {pid} failed: {e}"
    ))
}
