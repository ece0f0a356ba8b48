//! `stallscope probe`: per-thread scheduler and syscall accounting of one process over a
//! time window.

use std::{collections::HashMap, fmt::Write as _, time::Duration};

use anyhow::Result;
use serde::Serialize;
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    kernel_plane::accounting::{self, ThreadReport},
    kernel_plane::drain::{Drainer, EventCounts},
    kernel_plane::features::{Features, KernelPaths},
    kernel_plane::{KernelPlane, ProgramStats, WARMUP},
    os::procfs,
    python_plane::{self, Capture, PythonReport, PythonRequest},
};

/// Options of `stallscope probe`.
#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Process to account (all of its threads).
    #[arg(long)]
    pub pid: u32,
    /// Length of the window, e.g. `5s`, `500ms`.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Also stream raw events (switch, wakeup, syscall enter/exit) during the window and
    /// report their counts and rate; the Python plane adds the profile's deep-dive functions.
    #[arg(long)]
    pub deep_dive: bool,
    /// Report the kernel's run count and run time of each probe program (BPF_ENABLE_STATS).
    #[arg(long)]
    pub prog_stats: bool,
    /// Framework profile for the Python plane: `auto` detects vLLM or SGLang from the target's
    /// modules; `vllm`, `sglang` force one; `generic` watches only `--watch` functions.
    #[arg(long, default_value = "auto", value_parser = ["auto", "vllm", "sglang", "generic"])]
    pub framework: String,
    /// Time this Python function and read workload from its arguments (repeatable):
    /// `MODULE:QUALNAME[name=EXPR;...]`, EXPR = attribute path from a parameter, optionally in
    /// len(...) or sum(...), e.g. `__main__:Sched.run_batch[bs=len(batch.reqs)]`.
    #[arg(long = "watch", value_name = "SPEC")]
    pub watch: Vec<pyframe_tracer::WatchSpec>,
}

/// The JSON document `probe --json` prints.
#[derive(Debug, Serialize)]
pub struct ProbeReport {
    /// The process probed.
    pub pid: u32,
    /// Length of the window actually covered.
    pub window_ns: u64,
    /// Per thread, sorted by tid.
    pub threads: Vec<ThreadReport>,
    /// Deep-dive events lost (ring full) during the window; always reported.
    pub lost_events: u64,
    /// The target exited before the window ended: the result covers the part before.
    pub target_exited: bool,
    /// Human-readable remark about the result, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Deep-dive event counts (with `--deep-dive`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep_dive: Option<DeepDiveSummary>,
    /// Per-program run statistics (with `--prog-stats`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<ProgramStats>>,
    /// Python plane: calls of watched functions, lost records, probes.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub python: Option<PythonReport>,
}

/// What the deep-dive stream delivered.
#[derive(Debug, Serialize)]
pub struct DeepDiveSummary {
    /// Events drained, by kind.
    pub events: EventCounts,
    /// Events per second over the window.
    pub events_per_sec: f64,
}

/// Runs the probe and prints its report.
pub async fn run(args: &ProbeArgs, paths: &KernelPaths) -> Result<()> {
    let pid = args.pid;
    procfs::require_target(pid)?;
    let request = PythonRequest {
        framework: args.framework.clone(),
        watch: args.watch.clone(),
        deep_dive: args.deep_dive,
    };
    let mut notes = Vec::new();
    let mut capture = match Capture::start(pid as i32, &request)? {
        Ok(c) => Some(c),
        Err(why) => {
            notes.extend(why.map(|w| format!("python plane off: {w}")));
            None
        }
    };
    let plane = start_kernel_plane(args, paths, pid);
    let mut plane = match plane {
        Ok(p) => p,
        Err(e) => {
            if let Some(c) = capture {
                c.finish(false)?;
            }
            return Err(e);
        }
    };
    let drainer = if args.deep_dive {
        plane.set_deep_dive(true)?;
        plane.take_ring().map(|ring| Drainer::start(ring, |_| {}))
    } else {
        None
    };

    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    tokio::time::sleep(WARMUP).await;

    let mut names: HashMap<u32, String> = HashMap::new();
    let remember_names = |names: &mut HashMap<u32, String>| {
        for tid in procfs::threads(pid) {
            if let Some(c) = procfs::thread_comm(pid, tid) {
                names.insert(tid, c);
            }
        }
    };
    remember_names(&mut names);
    let start = plane.snapshot();
    eprintln!("probe: window open (pid {pid}, t={} ns)", start.taken_ns);

    let deadline = tokio::time::Instant::now() + args.duration;
    let mut interrupted = false;
    let mut target_exited = !procfs::process_exists(pid);
    while !target_exited && tokio::time::Instant::now() < deadline {
        let step = deadline.saturating_duration_since(tokio::time::Instant::now());
        tokio::select! {
            _ = tokio::time::sleep(step.min(Duration::from_millis(50))) => {}
            _ = sigint.recv() => { interrupted = true; break; }
            _ = sigterm.recv() => { interrupted = true; break; }
        }
        remember_names(&mut names);
        if let Some(c) = capture.as_mut() {
            c.poll();
        }
        target_exited = !procfs::process_exists(pid);
    }
    let end = plane.snapshot();
    eprintln!("probe: window closed (t={} ns)", end.taken_ns);

    let deep_dive = drainer.map(|d| {
        let (_ring, events) = d.stop();
        let secs = (end.taken_ns - start.taken_ns) as f64 / 1e9;
        DeepDiveSummary {
            events_per_sec: events.total as f64 / secs,
            events,
        }
    });
    let threads = accounting::window(pid, &start, &end, |tid, s| {
        names
            .get(&tid)
            .cloned()
            .unwrap_or_else(|| accounting::comm_from_bytes(&s.exit_comm))
    });
    let window_ns = end.taken_ns - start.taken_ns;
    let python = capture.map(|c| c.finish(target_exited)).transpose()?;
    let exit_note = if target_exited {
        Some(format!(
            "process {pid} exited after {:.3} s of the {:.3} s window; the result covers that part",
            window_ns as f64 / 1e9,
            args.duration.as_secs_f64()
        ))
    } else if interrupted {
        Some(format!(
            "interrupted after {:.3} s; the result covers that part",
            window_ns as f64 / 1e9
        ))
    } else {
        None
    };
    notes.extend(exit_note);
    let note = (!notes.is_empty()).then(|| notes.join("; "));
    if let Some(n) = &note {
        eprintln!("probe: note: {n}");
    }
    let report = ProbeReport {
        pid,
        window_ns,
        threads,
        lost_events: end.lost_events - start.lost_events,
        target_exited,
        note,
        deep_dive,
        programs: args.prog_stats.then(|| plane.program_stats()),
        python,
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", render_table(&report));
    }
    Ok(())
}

fn start_kernel_plane(args: &ProbeArgs, paths: &KernelPaths, pid: u32) -> Result<KernelPlane> {
    let features = Features::detect(paths);
    features.require()?;
    let mut plane = KernelPlane::load(&features)?;
    if args.prog_stats {
        plane.enable_run_stats(&features)?;
    }
    plane.watch(pid)?;
    Ok(plane)
}

fn ms(ns: u64) -> String {
    format!("{:.1}ms", ns as f64 / 1e6)
}

/// The human-readable form of a report.
pub fn render_table(r: &ProbeReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "pid {}  window {:.3}s  lost events {}",
        r.pid,
        r.window_ns as f64 / 1e9,
        r.lost_events
    );
    let _ = writeln!(
        out,
        "{:>8} {:<16} {:>10} {:>10} {:>10} {:>7} {:>7}  TOP SYSCALLS BY TIME",
        "TID", "COMM", "ON-CPU", "RUNQ-WAIT", "BLOCKED", "VCSW", "IVCSW"
    );
    for t in &r.threads {
        let top: Vec<String> = t
            .top_syscalls(3)
            .into_iter()
            .map(|(name, s)| format!("{name} {}x {}", s.count, ms(s.total_ns)))
            .collect();
        let comm = if t.exited {
            format!("{} (exited)", t.comm)
        } else {
            t.comm.clone()
        };
        let _ = writeln!(
            out,
            "{:>8} {:<16} {:>10} {:>10} {:>10} {:>7} {:>7}  {}",
            t.tid,
            comm,
            ms(t.on_cpu_ns),
            ms(t.runq_wait_ns),
            ms(t.blocked_ns),
            t.nvcsw,
            t.nivcsw,
            top.join(", ")
        );
    }
    if let Some(d) = &r.deep_dive {
        let _ =
            writeln!(
            out,
            "deep dive: {} events ({:.0}/s): switch {} wakeup {} sys_enter {} sys_exit {} sched_yield runs {} exit {}",
            d.events.total, d.events_per_sec, d.events.switch, d.events.wakeup,
            d.events.sys_enter, d.events.sys_exit, d.events.yield_runs, d.events.exit
        );
    }
    if let Some(progs) = &r.programs {
        for p in progs {
            let per = if p.run_count > 0 {
                p.run_time_ns as f64 / p.run_count as f64
            } else {
                0.0
            };
            let _ = writeln!(
                out,
                "program {:<20} runs {:>10}  {:>7.1} ns/run",
                p.tracepoint, p.run_count, per
            );
        }
    }
    if let Some(p) = &r.python {
        out.push_str(&python_plane::render_summary(p));
    }
    if let Some(n) = &r.note {
        let _ = writeln!(out, "note: {n}");
    }
    out
}
