//! `stallscope run`: the long-running sidecar. Discovers engine processes (or takes
//! `--pid`), attaches the Python probes and runs the sentinel on each, accounts their threads
//! in the kernel, serves the HTTP API, takes deep dives (on alerts, on request, and normal
//! references while healthy), re-attaches when an engine restarts, and detaches everything
//! on SIGINT/SIGTERM.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use crate::fleet::upload::{Counters, Uploader};
use crate::otlp::Otlp;
use anyhow::{bail, Result};
use log::{info, warn};

use super::{
    attacher::Attacher,
    dives::Dives,
    engine::Engine,
    identities::Identities,
    loop_watchdog::{self, Marker, Phase},
    processes::{self, ProcessNames, Scan},
    thread_time::ThreadTime,
};
use crate::{
    api::{export::IterationCsv, http, state::Shared},
    config::Config,
    kernel_plane::{
        features::{Features, KernelPaths},
        KernelPlane,
    },
    os::{affinity::Placement, procfs},
};

/// How long the rescan and the accounting, once due, wait for an iteration to end. Each
/// takes 1.4–6 ms with vLLM saturating both CPUs of a 2-vCPU node (60 s under load).
const WAIT_FOR_ITERATION: Duration = Duration::from_millis(250);

/// How long the lease of the probes that refused an attach has left, when that was the
/// refusal.
fn lease_left(e: &anyhow::Error) -> Option<Duration> {
    e.chain()
        .find_map(|c| match c.downcast_ref::<pyframe_tracer::Error>() {
            Some(pyframe_tracer::Error::Watched { retry_after, .. }) => Some(*retry_after),
            _ => None,
        })
}

/// Runs the daemon until SIGINT or SIGTERM.
pub fn run(cfg: &Config, paths: &KernelPaths) -> Result<()> {
    crate::os::memory::bound_free_heap();
    let features = Features::detect(paths);
    features.require()?;
    let listener = http::bind(cfg.http.listen)?;
    for dir in pyframe_tracer::reap::RING_DIRS {
        for f in pyframe_tracer::reap::orphans(std::path::Path::new(dir)) {
            info!(
                "removed {}: no attach holds it (left by a stallscope that stopped mid-attach)",
                f.display()
            );
        }
    }
    let shared = Arc::new(Shared::new(&cfg.state.alerts_log())?);
    let mut export = if cfg.state.iterations_csv.as_os_str().is_empty() {
        None
    } else {
        Some(IterationCsv::create(&cfg.state.iterations_csv)?)
    };
    let mut plane = KernelPlane::load(&features)?;
    plane.syscalls_in_deep_dives_only()?;
    // Loading parsed the kernel's BTF: ~9 MB of heap, free now.
    crate::os::memory::release_free_heap();
    let otlp = if cfg.otlp.endpoint.is_empty() {
        None
    } else {
        let o = Arc::new(Otlp::start(&cfg.otlp, shared.clone())?);
        shared.alerts.subscribe(o.clone());
        Some(o)
    };
    let node = cfg.fleet.node_name();
    let mut store = if cfg.store.endpoint.is_empty() {
        None
    } else {
        let m = &shared.metrics;
        let counters = Counters {
            uploaded: m.store_uploaded.clone(),
            dropped: m.store_dropped.clone(),
            failures: m.store_failures.clone(),
        };
        Some(Uploader::start(&cfg.store, node.clone(), counters)?)
    };
    let (mark, _watchdog) = loop_watchdog::start(
        cfg.sentinel.poll_interval,
        cfg.sentinel.verdict_priority,
        &shared.metrics.loop_phase,
    )?;
    shared
        .metrics
        .verdict_realtime
        .set(i64::from(mark.realtime()));
    let mut daemon = Daemon {
        mark,
        cfg,
        shared: shared.clone(),
        engines: BTreeMap::new(),
        attacher: Attacher::new(&cfg.sentinel, &cfg.state.dir),
        identities: Identities::new(cfg.pods.source()?, cfg.pods.timeout),
        kernel_only: BTreeSet::new(),
        thread_time: ThreadTime::default(),
        groups_shown: BTreeSet::new(),
        names: ProcessNames::default(),
        placement: cfg.watch.avoid_pinned_cpus.then(Placement::new).flatten(),
    };
    let mut dives = Dives::new(
        &cfg.deep_dive,
        cfg.deep_dive.dir(&cfg.state),
        shared.deep_dive.clone(),
    );
    // Engines named with --pid must attach now: a wrong pid is an error, not a retry. A pid
    // that is not a Python process gets the kernel plane only.
    for &pid in &cfg.watch.pids {
        if !procfs::process_exists(pid) {
            bail!("no process with pid {pid}: check the engine's pid (pgrep -f EngineCore)");
        }
        let placed = daemon.identities.wait(pid);
        let mut attached =
            Engine::attach(pid, placed.identity.clone(), &cfg.sentinel, &cfg.state.dir);
        // Probes another stallscope renews refuse this attach. When that stallscope was
        // killed (a restart after a crash), its lease runs out within one lease: wait it out
        // once rather than exit.
        if let Some(wait) = attached.as_ref().err().and_then(lease_left) {
            info!("engine {pid}: another stallscope's probes hold it; retrying in {wait:?}, once their lease has run out if no one renews it");
            std::thread::sleep(wait + Duration::from_millis(250));
            attached = Engine::attach(pid, placed.identity, &cfg.sentinel, &cfg.state.dir);
        }
        match attached {
            Ok(e) => {
                daemon.engines.insert(pid, e);
            }
            Err(e) if is_not_python(&e) => {
                warn!(
                    "pid {pid} is not a Python process: kernel-plane accounting only, no sentinel"
                );
                daemon.kernel_only.insert(pid);
            }
            Err(e) => return Err(e),
        }
    }
    let stop = Arc::new(AtomicBool::new(false));
    let http_thread = {
        let (shared, stop, dd, fleet) = (
            shared.clone(),
            stop.clone(),
            cfg.deep_dive.clone(),
            cfg.fleet.clone(),
        );
        std::thread::Builder::new()
            .name("stallscope-http".into())
            .spawn(move || {
                // Scrapes and status reads must be answered on a node the engine saturates,
                // where a thread at the normal policy may wait seconds for a CPU (BENCHMARKS.md,
                // Reliability). The reservation bounds what a flood of requests can take from
                // the engine to 1 ms in 10. Taken once, for the thread's life.
                crate::os::sched::reserved_or_normal();
                http::serve(listener, shared, dd, fleet, stop)
            })?
    };
    info!(
        "stallscope running: sentinel on engines matching {:?}{}, serving on http://{}",
        cfg.sentinel.engine_patterns,
        if cfg.watch.pids.is_empty() {
            String::new()
        } else {
            format!(" and pids {:?}", cfg.watch.pids)
        },
        cfg.http.listen
    );
    let mut last = plane.snapshot_threads();
    let mut rescan_at = Instant::now();
    let mut report_at = Instant::now() + cfg.report.interval;
    while !stop.load(Ordering::SeqCst) {
        let attach_seen = daemon.attacher.bell().seen();
        let queued_seen = shared.deep_dive.queued.seen();
        // The engines first: a pass that a doorbell started is there for their verdicts.
        daemon.take_attached();
        daemon.mark.enter(Phase::Sentinel);
        let mut ended = 0;
        for e in daemon.engines.values_mut() {
            ended += e.tick(&shared, &mut export);
        }
        daemon.reattach_expired();
        daemon.mark.enter(Phase::DeepDive);
        dives.tick(&mut daemon.engines, &mut plane, &daemon.mark);
        // The work that can wait (rescan, accounting: milliseconds each) runs in a pass
        // right after an iteration ended, when the next one is a step away, so that no
        // verdict waits for it; it waits at most WAIT_FOR_ITERATION for one.
        let now = Instant::now();
        let ready = |at: Instant| now >= at && (ended > 0 || now >= at + WAIT_FOR_ITERATION);
        if ready(rescan_at) {
            daemon.mark.enter(Phase::Rescan);
            daemon.rescan(&mut plane);
            rescan_at = Instant::now() + cfg.watch.rescan_interval;
        }
        if ready(report_at) {
            daemon.mark.enter(Phase::Accounting);
            last = daemon.thread_time.account(&mut plane, &last, &shared);
            report_at = Instant::now() + cfg.report.interval;
            if let Some(out) = &mut export {
                let _ = out.flush();
            }
            daemon.hand_over_deep_dives(otlp.as_deref(), store.as_mut());
            daemon.show_groups(&node);
        }
        daemon.mark.enter(Phase::Idle);
        // Until an engine's anchor call ends (its doorbell), an attach finishes, a deep dive
        // is queued or due, or the poll period for the rest.
        let mut bells: Vec<_> = daemon.engines.values().map(Engine::doorbell).collect();
        bells.push((daemon.attacher.bell().word(), attach_seen));
        bells.push((shared.deep_dive.queued.word(), queued_seen));
        let wait = dives.next_due_in().map_or(cfg.sentinel.poll_interval, |d| {
            d.min(cfg.sentinel.poll_interval)
        });
        sys_util::futex::wait_any(&bells, wait);
    }
    daemon.mark.enter(Phase::Stopping);
    dives.stop(&mut daemon.engines, &mut plane, &daemon.mark);
    let attached = daemon.attacher.join_all();
    daemon.engines.extend(attached);
    for pid in daemon.engines.keys().copied().collect::<Vec<_>>() {
        daemon.remove_engine(pid);
    }
    if let Some(out) = &mut export {
        out.flush()?;
    }
    daemon.hand_over_deep_dives(otlp.as_deref(), store.as_mut());
    if let Some(o) = otlp {
        o.shutdown();
    }
    if let Some(mut s) = store {
        s.shutdown();
    }
    drop(plane);
    info!("probes detached; stallscope stopped");
    match http_thread.join() {
        Ok(r) => r,
        Err(_) => bail!("the HTTP thread panicked"),
    }
}

struct Daemon<'a> {
    cfg: &'a Config,
    /// Marks the loop's phases for the watchdog.
    mark: Marker,
    shared: Arc<Shared>,
    engines: BTreeMap<u32, Engine>,
    attacher: Attacher,
    /// Where the followed processes sit in the cluster.
    identities: Identities,
    /// Pids given with --pid that are not Python: watched by the kernel plane only.
    kernel_only: BTreeSet<u32>,
    /// The kernel plane's watched processes and their threads' series.
    thread_time: ThreadTime,
    /// The serving groups shown in stallscope_fleet_group_info.
    groups_shown: BTreeSet<String>,
    /// The node's processes' names, kept between rescans.
    names: ProcessNames,
    /// Where the daemon's own threads run ([`crate::os::affinity`]); None when left alone.
    placement: Option<Placement>,
}

/// Whether an attach failed because the process is not Python at all.
fn is_not_python(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<pyframe_tracer::Error>(),
            Some(pyframe_tracer::Error::NotPython { .. })
        )
    })
}

impl Daemon<'_> {
    /// Takes in the engines whose attach has finished.
    fn take_attached(&mut self) {
        let attached = self.attacher.finished(&self.shared.engines);
        if !attached.is_empty() {
            // An attach parses the interpreter's symbol tables on a thread of its own: ~10 MB
            // of that thread's heap, free once it ended, stayed in RSS (23 -> 14 MB on vLLM).
            crate::os::memory::release_free_heap();
        }
        self.engines.extend(attached);
    }

    /// Hands the deep dives that finished since the last call to the OTLP export (a span
    /// each, named by its engine) and to the store's upload thread (its alerts date the
    /// engine's slowdown), reading the records once for both.
    fn hand_over_deep_dives(&mut self, otlp: Option<&Otlp>, store: Option<&mut Uploader>) {
        if otlp.is_none() && store.is_none() {
            return;
        }
        let records = self.shared.deep_dive.registry.lock();
        let records = records.expect("registry lock").records();
        if let Some(o) = otlp {
            o.deep_dives(&records, |pid| {
                self.identities.get(pid).map(|p| p.identity.clone())
            });
        }
        if let Some(s) = store {
            let alerts = self.shared.alerts.recent();
            s.deep_dives(&records, &alerts, |pid| {
                self.identities.get(pid).and_then(|p| p.identity.short())
            });
        }
    }

    /// Says this node's serving groups (those of its engines) in stallscope_fleet_group_info.
    fn show_groups(&mut self, node: &str) {
        let groups: BTreeSet<String> = self
            .shared
            .engines
            .statuses()
            .iter()
            .filter_map(|s| self.cfg.fleet.group_of(&s.identity))
            .collect();
        // Series are removed one by one (a reset would leave a scrape without them, and a
        // Prometheus rule joined through them would resolve and fire again).
        let m = &self.shared.metrics.fleet_group;
        for gone in self.groups_shown.difference(&groups) {
            let _ = m.remove_label_values(&[gone.as_str(), node]);
        }
        for g in &groups {
            m.with_label_values(&[g.as_str(), node]).set(1);
        }
        self.groups_shown = groups;
    }

    /// Detaches an engine and removes its status and series.
    fn remove_engine(&mut self, pid: u32) {
        let threads = self.thread_time.labels(pid);
        if let Some(e) = self.engines.remove(&pid) {
            e.detach(&self.shared, &threads);
        }
    }

    /// Engines whose probes removed themselves (their lease ran out while this process was
    /// stopped or starved) are let go here; the next rescan attaches them again.
    fn reattach_expired(&mut self) {
        let expired: Vec<u32> = self
            .engines
            .iter()
            .filter(|(_, e)| e.probes_removed())
            .map(|(&pid, _)| pid)
            .collect();
        for pid in expired {
            warn!(
                "engine {pid}: its probes removed themselves: stallscope did not renew their lease for {:?} ([sentinel] probe_lease; was it stopped, or starved of CPU?); attaching them again",
                self.cfg.sentinel.probe_lease
            );
            self.remove_engine(pid);
        }
    }

    /// Follows processes coming and going: kernel-plane watches and sentinel engines (whose
    /// attaches start here and finish on their own threads).
    fn rescan(&mut self, plane: &mut KernelPlane) {
        let Scan { engines, watched } = processes::scan(
            self.cfg,
            &mut self.names,
            |pid| self.engines.contains_key(&pid),
            |pid| self.thread_time.watches(pid),
        );
        // Engines that exited (or no longer match): detach and forget.
        let gone: Vec<u32> = self
            .engines
            .keys()
            .copied()
            .filter(|p| !engines.contains(p) || !procfs::process_exists(*p))
            .collect();
        for pid in gone {
            info!("engine {pid} exited; waiting for it (or a restarted engine) to appear");
            self.remove_engine(pid);
        }
        // A process is followed once its identity is known, so that its first figure has it.
        self.identities.retain(|p| watched.contains(&p));
        let placed: BTreeMap<u32, _> = watched
            .iter()
            .filter_map(|&p| Some((p, self.identities.get(p)?.clone())))
            .collect();
        for &pid in &engines {
            let Some(p) = placed.get(&pid) else {
                continue;
            };
            if self.engines.contains_key(&pid)
                || self.kernel_only.contains(&pid)
                || !self.attacher.may_start(pid)
            {
                continue;
            }
            self.attacher
                .start(pid, p.identity.clone(), &self.shared.engines);
        }
        self.attacher.keep_only(&engines, &self.shared.engines);
        let labels = placed.into_iter().map(|(p, x)| (p, x.labels)).collect();
        self.thread_time.follow(&labels, plane, &self.shared);
        if let Some(p) = &mut self.placement {
            p.follow(&watched);
        }
    }
}
