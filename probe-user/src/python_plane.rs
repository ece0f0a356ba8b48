//! The Python plane as `stallscope probe` uses it: attach the probe, collect calls while the window is open,
//! detach, summarise.

use std::fmt::Write as _;

use anyhow::Result;
use pyframe_tracer::{
    ring::Record, AttachOptions, Call, Error as PyError, Framework, Session, WatchSpec,
};
use serde::Serialize;

/// What the user asked of the Python plane.
#[derive(Debug, Clone)]
pub struct PythonRequest {
    /// `auto`, or a profile name.
    pub framework: String,
    /// `--watch` specs.
    pub watch: Vec<WatchSpec>,
    /// Also watch the profile's deep-dive functions.
    pub deep_dive: bool,
}

/// A running capture.
pub struct Capture {
    session: Session,
    records: Vec<Record>,
}

/// What the capture produced.
#[derive(Debug, Serialize)]
pub struct PythonReport {
    /// Every call captured while attached, in end order per thread.
    pub calls: Vec<Call>,
    /// Records the probe could not write (ring full).
    pub lost_records: u64,
    /// The applied framework profile.
    pub framework: Option<String>,
    /// Target's CPython version.
    pub python: String,
    /// Watched functions and how each was instrumented.
    pub probes: Vec<pyframe_tracer::session::ProbeInfo>,
    /// What wrote the records in the target: `native` or `python` (and why not native).
    pub writer: String,
    /// Why the compiled writer was not used, when it was not.
    pub writer_note: Option<String>,
    /// Longest time a target thread was stopped while attaching or detaching (µs).
    pub max_pause_us: u64,
    /// Optional profile functions that could not be watched.
    pub warnings: Vec<String>,
}

impl Capture {
    /// Attaches. When the user did not ask for the Python plane explicitly (no `--watch`, framework `auto`),
    /// failing to attach is not an error: it returns `Err` with a note for the report, or with `None` when the
    /// target is simply not a Python process.
    pub fn start(
        pid: i32,
        req: &PythonRequest,
    ) -> Result<std::result::Result<Capture, Option<String>>> {
        let explicit = !req.watch.is_empty() || req.framework != "auto";
        let framework = match req.framework.as_str() {
            "auto" => Framework::Auto,
            name => Framework::Named(name.to_string()),
        };
        let options = AttachOptions {
            specs: req.watch.clone(),
            framework,
            deep_dive: req.deep_dive,
            ..AttachOptions::default()
        };
        match Session::attach(pid, options) {
            Ok(session) => Ok(Ok(Capture {
                session,
                records: Vec::new(),
            })),
            Err(PyError::NotPython { .. }) if !explicit => Ok(Err(None)),
            Err(e) if !explicit => Ok(Err(Some(e.to_string()))),
            Err(e) => Err(e.into()),
        }
    }

    /// Moves new records out of the ring (call often enough that lanes do not fill).
    pub fn poll(&mut self) {
        self.session.drain(&mut self.records);
    }

    /// Drains, detaches and builds the report. `target_gone` skips the detach request.
    pub fn finish(mut self, target_gone: bool) -> Result<PythonReport> {
        self.poll();
        let Capture { session, records } = self;
        let calls = records.iter().map(|r| session.call(r)).collect();
        let lost_records = session.lost_records();
        let framework = session.framework.clone();
        let python = session.runtime().version_string();
        let probes = session.probes.clone();
        let warnings = session.warnings.clone();
        let (writer, writer_note) = (session.writer.clone(), session.writer_note.clone());
        let pause = if target_gone {
            session.pause
        } else {
            session.detach()?
        };
        Ok(PythonReport {
            calls,
            lost_records,
            framework,
            python,
            probes,
            writer,
            writer_note,
            max_pause_us: pause.as_micros() as u64,
            warnings,
        })
    }
}

/// Per-function summary: count, p50/p99/max duration.
pub fn render_summary(r: &PythonReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "python {}  framework {}  lost records {}  writer {}",
        r.python,
        r.framework.as_deref().unwrap_or("-"),
        r.lost_records,
        r.writer
    );
    if let Some(note) = &r.writer_note {
        let _ = writeln!(out, "compiled writer not used: {note}");
    }
    let _ = writeln!(
        out,
        "{:<60} {:>8} {:>10} {:>10} {:>10}",
        "FUNCTION", "CALLS", "P50", "P99", "MAX"
    );
    for p in &r.probes {
        let func = p.func();
        let mut d: Vec<u64> = r
            .calls
            .iter()
            .filter(|c| c.func == func)
            .map(|c| c.end_ns.saturating_sub(c.start_ns))
            .collect();
        d.sort_unstable();
        let q = |f: f64| {
            d.get(((d.len() as f64 - 1.0) * f).round() as usize)
                .copied()
        };
        let fmt =
            |v: Option<u64>| v.map_or("-".to_string(), |ns| format!("{:.3}ms", ns as f64 / 1e6));
        let _ = writeln!(
            out,
            "{:<60} {:>8} {:>10} {:>10} {:>10}",
            func,
            d.len(),
            fmt(q(0.5)),
            fmt(q(0.99)),
            fmt(d.last().copied())
        );
    }
    for w in &r.warnings {
        let _ = writeln!(out, "warning: {w}");
    }
    out
}
