//! `stallscope run`: the long-running sidecar. Watches the configured processes (by pid
//! or by name pattern, rescanned periodically), logs their per-thread accounting, and
//! detaches everything on SIGINT/SIGTERM.

use std::collections::BTreeSet;

use anyhow::Result;
use log::{info, warn};
use tokio::signal::unix::{signal, SignalKind};

use crate::{
    accounting,
    config::Config,
    features::{Features, KernelPaths},
    kernel_plane::{KernelPlane, Snapshot},
    procfs,
};

/// Runs the daemon until SIGINT or SIGTERM.
pub async fn run(config: &Config, paths: &KernelPaths) -> Result<()> {
    let features = Features::detect(paths);
    features.require()?;
    let mut plane = KernelPlane::load(&features)?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let mut sigterm = signal(SignalKind::terminate())?;
    info!(
        "stallscope running; watching pids {:?} and processes matching {:?}",
        config.watch.pids, config.watch.process_patterns
    );

    let mut watched: BTreeSet<u32> = BTreeSet::new();
    rescan(config, &mut plane, &mut watched);
    let mut last = plane.snapshot();
    let mut rescan_tick = tokio::time::interval(config.watch.rescan_interval);
    let mut report_tick = tokio::time::interval(config.report.interval);
    report_tick.tick().await;
    loop {
        tokio::select! {
            _ = rescan_tick.tick() => rescan(config, &mut plane, &mut watched),
            _ = report_tick.tick() => last = report(&mut plane, &watched, &last),
            _ = sigint.recv() => { info!("SIGINT: stopping"); break; }
            _ = sigterm.recv() => { info!("SIGTERM: stopping"); break; }
        }
    }
    drop(plane);
    info!("probes detached; stallscope stopped");
    Ok(())
}

/// Adds processes that match the configuration and drops the ones that exited.
fn rescan(config: &Config, plane: &mut KernelPlane, watched: &mut BTreeSet<u32>) {
    let me = std::process::id();
    let mut wanted: BTreeSet<u32> = config
        .watch
        .pids
        .iter()
        .copied()
        .filter(|p| procfs::process_exists(*p))
        .collect();
    if !config.watch.process_patterns.is_empty() {
        for pid in procfs::all_pids() {
            let comm = procfs::thread_comm(pid, pid).unwrap_or_default();
            let cmd = procfs::cmdline(pid).unwrap_or_default();
            let hit = config
                .watch
                .process_patterns
                .iter()
                .any(|p| comm.contains(p.as_str()) || cmd.contains(p.as_str()));
            if hit && pid != me {
                wanted.insert(pid);
            }
        }
    }
    for &pid in wanted.difference(&watched.clone()) {
        match plane.watch(pid) {
            Ok(()) => {
                info!(
                    "watching pid {pid} ({})",
                    procfs::cmdline(pid).unwrap_or_default()
                );
                watched.insert(pid);
            }
            Err(e) => warn!("cannot watch pid {pid}: {e:#}"),
        }
    }
    for pid in watched.clone().difference(&wanted) {
        info!("pid {pid} is gone; no longer watched");
        let _ = plane.unwatch(*pid);
        watched.remove(pid);
    }
    if watched.is_empty() {
        info!("watching nothing yet");
    }
}

/// Logs each watched thread's accounting since the previous report.
fn report(plane: &mut KernelPlane, watched: &BTreeSet<u32>, last: &Snapshot) -> Snapshot {
    let now = plane.snapshot();
    let secs = (now.taken_ns - last.taken_ns) as f64 / 1e9;
    let mut exited = Vec::new();
    for &pid in watched {
        for t in accounting::window(pid, last, &now, |tid, s| {
            procfs::thread_comm(pid, tid)
                .unwrap_or_else(|| accounting::comm_from_bytes(&s.exit_comm))
        }) {
            let top = t.top_syscalls(1);
            info!(
                "pid {pid} tid {} {:<16} on-cpu {:.1}ms runq {:.1}ms blocked {:.1}ms over {secs:.1}s{}",
                t.tid,
                t.comm,
                t.on_cpu_ns as f64 / 1e6,
                t.runq_wait_ns as f64 / 1e6,
                t.blocked_ns as f64 / 1e6,
                top.first()
                    .map(|(n, s)| format!("; top syscall {n} {}x {:.1}ms", s.count, s.total_ns as f64 / 1e6))
                    .unwrap_or_default()
            );
            if t.exited {
                exited.push(t.tid);
            }
        }
    }
    if now.lost_events > last.lost_events {
        warn!(
            "{} deep-dive events lost since the last report",
            now.lost_events - last.lost_events
        );
    }
    plane.forget_threads(&exited);
    now
}
