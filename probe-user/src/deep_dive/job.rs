//! Deep dives inside the daemon. A capture is fed by the engine's own probe calls (no second
//! attach), polled by the daemon's loop, and handed to a low-priority writer thread once its
//! window is over. The same captures, taken while the engine is healthy, make the rolling
//! normal reference that alert-triggered deep dives are ranked against.

use std::{collections::BTreeMap, io::BufWriter, path::PathBuf, sync::Arc, time::Duration};

use anyhow::{Context, Result};
use log::{info, warn};
use pod_identity::Identity;
use pyframe_tracer::Call;

use super::{
    analysis::Reference,
    book::{Book, KeptReference},
    capture::{Collected, Options, PythonSource, Running},
    output::{self, Baseline},
    registry::{Phase, Request, SuspectBrief},
    timeline::Timeline,
};
use crate::{
    config::DeepDiveConfig, gpu_plane::GpuEvent, kernel_plane::KernelPlane, os::clock, os::procfs,
};

/// Suspects listed in a deep dive's record.
const LISTED_SUSPECTS: usize = 5;

/// What a capture is for.
#[derive(Debug, Clone)]
pub enum Purpose {
    /// A normal-reference recording of a healthy engine.
    Reference,
    /// A deep dive (its record, and a normal window to record first, if any).
    DeepDive(Request),
}

/// A capture the daemon is running.
pub struct Job {
    /// The engine.
    pub pid: u32,
    /// What it is for.
    pub purpose: Purpose,
    running: Running,
    /// Where the deep-dive window opens, monotonic ns: after the normal window, if any,
    /// from the request's instant (a scheduled one) or from the capture's start.
    split_ns: u64,
    /// Where the window closes, monotonic ns.
    end_ns: u64,
    /// The window is over: the capture's threads are stopping.
    ending: bool,
    /// Stopped early and not wanted any more: nothing is written.
    abandoned: bool,
}

impl Job {
    /// Starts capturing `pid`, placed by `identity`. `engine` describes the engine's attached probes (their calls
    /// are handed over with [`Job::feed`]); with `gpu_fed`, the engine's GPU events come the
    /// same way ([`Job::feed_gpu`]) instead of from an agent of the capture's own.
    pub fn start(
        purpose: Purpose,
        pid: u32,
        identity: Identity,
        engine: PythonSource,
        gpu_fed: bool,
        cfg: &DeepDiveConfig,
        plane: &mut KernelPlane,
    ) -> Result<Job> {
        let (baseline, duration) = match &purpose {
            Purpose::Reference => (Duration::ZERO, cfg.reference_duration),
            Purpose::DeepDive(r) => (r.baseline, r.duration),
        };
        let opts = Options {
            pid,
            python: engine,
            sample_hz: if cfg.has("stacks") {
                cfg.stack_sample_hz
            } else {
                0.0
            },
            telemetry_hz: if cfg.has("telemetry") {
                cfg.telemetry_hz
            } else {
                0.0
            },
            kernel_events: cfg.has("kernel"),
            max_events: cfg.max_events,
            gpu: cfg.has("gpu") && !gpu_fed,
            identity,
        };
        // A request set for an instant is started ahead of it (the scheduler's lead): its
        // capture's sources are running when the window opens at the instant, and what comes
        // before it is a lead-in.
        let ahead_ns = match &purpose {
            Purpose::DeepDive(Request {
                start_at_unix_ns: Some(t),
                ..
            }) => t.saturating_sub(clock::unix_ns()),
            _ => 0,
        };
        let begin_ns = clock::monotonic_ns() + ahead_ns;
        let split_ns = begin_ns + baseline.as_nanos() as u64;
        let running = Running::start(opts, plane)?;
        Ok(Job {
            pid,
            purpose,
            running,
            split_ns,
            end_ns: split_ns + duration.as_nanos() as u64,
            ending: false,
            abandoned: false,
        })
    }

    /// Hands over the engine's calls.
    pub fn feed(&mut self, calls: Vec<Call>) {
        self.running.feed(calls);
    }

    /// Hands over the engine's GPU events.
    pub fn feed_gpu(&mut self, events: BTreeMap<u32, Vec<GpuEvent>>) {
        self.running.feed_gpu(events);
    }

    /// Adds a remark to the capture's notes.
    pub fn note(&mut self, note: String) {
        self.running.note(note);
    }

    /// Polls the capture. Once its window is over or the engine is gone, ends it without
    /// waiting for its threads (a busy host may take seconds to drain the kernel's events,
    /// and the daemon's loop must not wait for that). True once they have stopped:
    /// [`Job::finish`] does not wait then.
    pub fn poll(&mut self, plane: &mut KernelPlane) -> bool {
        if !self.ending {
            self.running.poll();
            if clock::monotonic_ns() >= self.end_ns || !procfs::process_exists(self.pid) {
                self.end(plane);
            }
        }
        self.ending && self.running.stopped()
    }

    /// How long until the window is over (zero once it is).
    pub fn ends_in(&self) -> Duration {
        Duration::from_nanos(self.end_ns.saturating_sub(clock::monotonic_ns()))
    }

    /// Whether the window is over (the capture is stopping or stopped).
    pub fn ending(&self) -> bool {
        self.ending
    }

    fn end(&mut self, plane: &mut KernelPlane) {
        if let Err(e) = self.running.begin_stop(plane) {
            warn!("stopping a capture: {e:#}");
        }
        self.ending = true;
    }

    /// Ends a capture that is no longer wanted (a reference cut short by an alert), without
    /// waiting; [`Job::finish`] then discards it.
    pub fn abandon(&mut self, plane: &mut KernelPlane) {
        self.abandoned = true;
        self.end(plane);
    }

    /// Stops capturing (the kernel plane gets its ring back) and returns what was captured
    /// and where the deep-dive window starts.
    fn stop(self, plane: &mut KernelPlane) -> Result<(Collected, u64)> {
        let split = self.split_ns;
        Ok((self.running.finish(plane)?, split))
    }

    /// Stops capturing and writes the result on a low-priority thread (returned): a
    /// reference goes to the shared references, a deep dive's trace and report to `dir`, its
    /// outcome to its record. An abandoned capture is only stopped.
    pub fn finish(
        self,
        plane: &mut KernelPlane,
        book: Arc<Book>,
        dir: PathBuf,
        max_bytes: u64,
    ) -> Option<std::thread::JoinHandle<()>> {
        let pid = self.pid;
        let purpose = self.purpose.clone();
        let abandoned = self.abandoned;
        let stopped = self.stop(plane);
        if abandoned {
            if let Err(e) = stopped {
                warn!("stopping a capture: {e:#}");
            }
            return None;
        }
        let id = match &purpose {
            Purpose::DeepDive(r) => Some(r.id),
            Purpose::Reference => None,
        };
        let (collected, split) = match stopped {
            Ok(c) => c,
            Err(e) => {
                warn!("engine {pid}: capture failed: {e:#}");
                if let Some(id) = id {
                    registry(&book).fail(id, format!("{e:#}"));
                }
                return None;
            }
        };
        if let Some(id) = id {
            registry(&book).update(id, |r| r.state = Phase::Writing);
        }
        let writer_book = book.clone();
        let spawned = std::thread::Builder::new()
            .name("stallscope-writer".into())
            .spawn(move || {
                crate::os::sched::background();
                match purpose {
                    Purpose::Reference => keep_reference(&collected, &writer_book),
                    Purpose::DeepDive(req) => {
                        let reference = writer_book
                            .references
                            .lock()
                            .expect("references")
                            .get(&pid)
                            .map(|k| k.reference.clone());
                        match write_deep_dive(&collected, split, &req, reference, &dir, max_bytes) {
                            Ok(done) => registry(&writer_book).update(req.id, done),
                            Err(e) => {
                                warn!("deep dive {}: {e:#}", req.id);
                                registry(&writer_book).fail(req.id, format!("{e:#}"));
                            }
                        }
                    }
                }
                drop(collected);
                crate::os::memory::release_free_heap();
            });
        match spawned {
            Ok(h) => Some(h),
            Err(e) => {
                if let Some(id) = id {
                    registry(&book).fail(id, format!("cannot start the writer thread: {e}"));
                }
                None
            }
        }
    }
}

fn registry(book: &Book) -> std::sync::MutexGuard<'_, super::registry::Registry> {
    book.registry.lock().expect("deep-dive registry lock")
}

/// Turns a healthy capture into the engine's normal reference (and shows it in the status).
fn keep_reference(c: &Collected, book: &Book) {
    let timeline = Timeline::build(c);
    let taken = clock::unix_ms();
    let r = Reference::from_window(
        c,
        &timeline,
        c.start_ns,
        c.end_ns,
        format!("the rolling normal reference recorded at unix ms {taken}"),
    );
    info!(
        "engine {}: normal reference recorded ({} cycles, mean {:.2} ms, {} kernel events)",
        c.pid,
        r.cycles.len(),
        r.mean_cycle_ms,
        c.kernel.len()
    );
    if !r.cycles.is_empty() {
        book.references.lock().expect("references").insert(
            c.pid,
            KeptReference {
                recorded_unix_ms: taken,
                reference: Arc::new(r),
            },
        );
    }
}

/// Writes a deep dive's trace and report; returns how to complete its record.
fn write_deep_dive(
    c: &Collected,
    split: u64,
    req: &Request,
    reference: Option<Arc<Reference>>,
    dir: &std::path::Path,
    max_bytes: u64,
) -> Result<impl FnOnce(&mut super::registry::Record)> {
    sys_util::private::create_dir(dir).with_context(|| {
        format!(
            "cannot create the deep-dive directory {} (set [deep_dive] dir)",
            dir.display()
        )
    })?;
    let trace_path = dir.join(format!("{}-{}.pftrace", req.id, c.pid));
    let report_path = dir.join(format!("{}-{}.json", req.id, c.pid));
    let trace = sys_util::private::create_file(&trace_path)
        .with_context(|| format!("cannot create {}", trace_path.display()))?;
    let report = sys_util::private::create_file(&report_path)
        .with_context(|| format!("cannot create {}", report_path.display()))?;
    let baseline = if req.baseline.is_zero() {
        reference.as_deref().map(Baseline::Kept)
    } else {
        Some(Baseline::Window(
            "the normal window recorded before the deep dive",
        ))
    };
    let w = output::write(
        c,
        split,
        baseline,
        BufWriter::new(trace),
        &trace_path,
        Some(report),
        max_bytes,
    )?;
    info!(
        "deep dive {} of engine {}: {} ({} events in {})",
        req.id,
        c.pid,
        w.report.summary,
        w.stats.events,
        trace_path.display()
    );
    let offset = w.stats.realtime_minus_monotonic_ns;
    let wall = move |mono: u64| (mono as i64 + offset) as u64;
    let window = [wall(split.clamp(c.start_ns, c.end_ns)), wall(c.end_ns)];
    Ok(move |r: &mut super::registry::Record| {
        r.state = Phase::Done;
        r.window_unix_ns = Some(window);
        r.clock_offset_ns = Some(offset);
        r.trace = Some(trace_path.display().to_string());
        r.report = Some(report_path.display().to_string());
        r.summary = Some(w.report.summary.clone());
        r.category = w.report.category.clone();
        r.suspects = w
            .report
            .suspects
            .iter()
            .take(LISTED_SUSPECTS)
            .map(|s| SuspectBrief {
                name: s.name.clone(),
                score: s.score,
                delta_beta: s.delta_beta,
            })
            .collect();
    })
}
