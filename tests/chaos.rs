//! The daemon killed (SIGKILL) at random points of its life while it watches the toy engine:
//! loading its probes, attaching, draining, fitting, and inside a deep dive's capture or its
//! writing. The engine must keep stepping through it all, the probes of a killed daemon must
//! remove themselves once its lease runs out, and the next daemon must clean what was left
//! and attach again.
//!
//! `cargo xtask test` kills 10 times; `STALLSCOPE_CHAOS_KILLS=100` is the full run
//! (BENCHMARKS.md, Reliability), `STALLSCOPE_CHAOS_SEED` replays a run's kill times.

use std::{
    fs::File,
    net::TcpStream,
    path::Path,
    process::Child,
    time::{Duration, Instant},
};

mod common;
use common::daemon::{config, metric, Daemon};
use common::proc_events::ProcEvents;
use common::{
    expect_failure, free_port, http_request, pin_this_thread_to_cpu, require_root,
    set_this_thread_affinity, stallscope, start_engine, start_engine_tagged, start_timed_engine,
    this_thread_affinity, tmpdir,
};
use sys_util::clock::monotonic_ns;

/// The probes' lease in these daemons: a killed daemon's probes remove themselves this long
/// after its last renewal.
const LEASE: &str = "1s";

fn kills() -> u64 {
    std::env::var("STALLSCOPE_CHAOS_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10)
}

/// splitmix64: the kill times from one printed seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        (z ^ (z >> 31)) % n
    }
}

/// The test daemon's configuration with a short lease, a quick fit (200 steps) and 1 s deep
/// dives.
fn chaos_config(dir: &Path, engine: u32, port: u16) -> std::path::PathBuf {
    let cfg = config(dir, engine, port, 200);
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(
            "poll_interval = \"1ms\"",
            &format!("poll_interval = \"1ms\"\nprobe_lease = \"{LEASE}\""),
        )
        .replace("duration = \"3s\"", "duration = \"1s\"");
    std::fs::write(&cfg, text).unwrap();
    cfg
}

/// A daemon on `pid` with [`chaos_config`] on a free port, its log in `dir/log`; (port, child).
fn spawn_daemon(dir: &Path, pid: u32, log: &str) -> (u16, Child) {
    let port = free_port();
    let cfg = chaos_config(dir, pid, port);
    let log = File::create(dir.join(log)).unwrap();
    let child = stallscope()
        .arg("run")
        .arg("--config")
        .arg(&cfg)
        .stderr(log)
        .spawn()
        .unwrap();
    (port, child)
}

/// Whether `pid` still runs: a crashed engine stays a zombie until this test reaps it.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| Some(*sys_util::task_state::stat_fields(&s).first()? != "Z"))
        .unwrap_or(false)
}

/// Whether the engine maps anything of stallscope's (the probe's ring) besides the probe's
/// compiled writer, which stays loaded.
fn probe_mapped(pid: u32) -> bool {
    !common::stallscope_mappings(pid).is_empty()
}

/// Waits until the engine maps nothing of stallscope's; fails after `limit`, saying `when`.
fn wait_unmapped(pid: u32, limit: Duration, when: &str) {
    let deadline = Instant::now() + limit;
    while probe_mapped(pid) {
        assert!(
            Instant::now() < deadline,
            "the probe is still mapped {when}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn rings_of(pid: u32) -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&format!("stallscope-ring-{pid}-")))
        .collect()
}

fn kill(child: &mut Child) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
}

#[test]
fn killed_daemons_never_harm_the_engine_and_the_next_one_cleans_up() {
    require_root();
    let dir = tmpdir("chaos");
    let times = dir.join("toy-steps.txt");
    let engine = start_timed_engine(&times);
    let pid = engine.id();
    let seed = std::env::var("STALLSCOPE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(monotonic_ns);
    eprintln!("chaos: {} kills, STALLSCOPE_CHAOS_SEED={seed}", kills());
    let mut rng = Rng(seed);
    let start_ns = monotonic_ns();
    let mut in_deep_dive = 0;
    for i in 0..kills() {
        let (port, mut daemon) = spawn_daemon(&dir, pid, &format!("daemon-{i}.log"));
        // One kill in three lands in a deep dive: asked for as soon as the daemon lists the
        // engine, killed within its 1 s capture or while it writes the trace.
        let after = if i % 3 == 2 {
            let limit = Instant::now() + Duration::from_secs(20);
            let listed = || {
                TcpStream::connect(("127.0.0.1", port)).is_ok()
                    && http_request(port, "GET", "/api/v1/status", "", "")
                        .1
                        .contains(&format!("\"pid\":{pid}"))
            };
            while !listed() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(20));
            }
            let body = format!(r#"{{"pid":{pid},"duration_s":1}}"#);
            let (code, answer) = http_request(port, "POST", "/api/v1/deep-dive", "", &body);
            if code == 202 {
                in_deep_dive += 1;
            } else {
                eprintln!("chaos: kill {i}: no deep dive ({code} {answer})");
            }
            Duration::from_millis(rng.below(2500))
        } else {
            Duration::from_millis(rng.below(4000))
        };
        std::thread::sleep(after);
        kill(&mut daemon);
        assert!(
            alive(pid),
            "kill {i} ({after:?} into the daemon's life): the engine died"
        );
    }
    eprintln!("chaos: {in_deep_dive} kills came during a deep dive");
    assert!(
        in_deep_dive >= kills() / 6,
        "only {in_deep_dive} of the {} kills meant to come during a deep dive did",
        kills() / 3
    );

    // The last killed daemon's probes go once its lease runs out.
    wait_unmapped(
        pid,
        Duration::from_secs(15),
        &format!("15 s after its daemon was killed (lease {LEASE})"),
    );

    // The next daemon cleans what was left (rings of attaches it was killed in) and attaches.
    let port = free_port();
    let mut last = Daemon::start_with(&dir, port, chaos_config(&dir, pid, port));
    last.wait_for("iterations", Duration::from_secs(60), |d| {
        d.iterations() > 50
    });
    assert!(
        rings_of(pid).is_empty(),
        "ring files left after the next daemon attached: {:?}",
        rings_of(pid)
    );
    assert!(last.stop().success());
    wait_unmapped(pid, Duration::from_secs(10), "after a clean stop");

    assert_stepped_throughout(&times, start_ns);
    assert!(alive(pid));
}

/// The engine's own clock: it stepped all along since `start_ns` (no gap of a second between
/// two steps). The toy flushes its file every 50 steps.
fn assert_stepped_throughout(times: &Path, start_ns: u64) {
    let end_ns = monotonic_ns();
    std::thread::sleep(Duration::from_secs(1));
    let ends: Vec<u64> = std::fs::read_to_string(times)
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').next()?.parse().ok())
        .filter(|e| (start_ns..end_ns).contains(e))
        .collect();
    let longest_gap = ends
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or(u64::MAX);
    eprintln!(
        "chaos: {} engine steps in {:.1} s, longest gap between two {:.1} ms",
        ends.len(),
        (end_ns - start_ns) as f64 / 1e9,
        longest_gap as f64 / 1e6
    );
    assert!(
        longest_gap < 1_000_000_000,
        "the engine stopped stepping for {} ms",
        longest_gap / 1_000_000
    );
}

/// The pids tracing threads of `pid` (TracerPid in each thread's status).
fn tracers(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            pyframe_tracer::procfs::status_field(&status, "TracerPid")?
                .parse()
                .ok()
                .filter(|t| *t != 0)
        })
        .collect()
}

/// `f` run with this thread on CPU 0 (the toy engine's, see `start_toy`) at SCHED_FIFO
/// priority 2, above the remote-call helper's 1; then back on its CPUs at SCHED_OTHER.
/// Children would inherit both, so only waits and kills run inside.
fn holding_the_engines_cpu<T>(f: impl FnOnce() -> T) -> T {
    let before = this_thread_affinity();
    pin_this_thread_to_cpu(0);
    let set = |policy, priority| {
        let param = libc::sched_param {
            sched_priority: priority,
        };
        // SAFETY: pid 0 is the calling thread; `param` outlives the call.
        let rc = unsafe { libc::sched_setscheduler(0, policy, &param) };
        assert_eq!(
            rc,
            0,
            "sched_setscheduler: {}",
            std::io::Error::last_os_error()
        );
    };
    set(libc::SCHED_FIFO, 2);
    let out = f();
    set(libc::SCHED_OTHER, 0);
    set_this_thread_affinity(&before);
    out
}

/// SIGKILLs `child` and reaps it without leaving the CPU: spins on `try_wait` for up to
/// `spin`, then blocks (on a single-CPU host the child could not exit while this spins above
/// it). Returns once it is reaped.
fn kill_spinning(child: &mut Child, spin: Duration) {
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    let until = Instant::now() + spin;
    while Instant::now() < until {
        if child.try_wait().unwrap().is_some() {
            return;
        }
        std::hint::spin_loop();
    }
    child.wait().unwrap();
}

/// The daemon SIGKILLed the moment a thread of the engine is traced, i.e. while a remote call
/// is under way (in the old design this killed the engine: the thread ran on from registers
/// pointing into the call). The helper process that owns the call must finish it and let the
/// thread go, the engine must keep stepping, and the probe so installed must remove itself at
/// lease end. The call lasts about as long as the daemon takes to die (1-2 ms), so the test
/// holds the call open: it waits for the attach on the engine's only CPU at a real-time
/// priority above the helper's, and from the attach until the daemon is reaped it keeps that
/// CPU, so the traced thread cannot run the call's steps. The kernel's ptrace events time the
/// attach and the detach: a kill counts only when the detach came after the daemon was dead
/// and reaped. `cargo xtask test` kills 3 times; `STALLSCOPE_CHAOS_TRACED_KILLS` sets the
/// count.
#[test]
fn a_daemon_killed_mid_remote_call_leaves_the_engine_stepping() {
    require_root();
    let dir = tmpdir("chaos-traced");
    let times = dir.join("toy-steps.txt");
    let engine = start_timed_engine(&times);
    let pid = engine.id();
    let count: u32 = std::env::var("STALLSCOPE_CHAOS_TRACED_KILLS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let events = ProcEvents::listen().expect(
        "the kernel's process events (cn_proc) could not be subscribed to: run as root on a \
         kernel with CONFIG_PROC_EVENTS",
    );
    let start_ns = monotonic_ns();
    let (mut i, mut late) = (0, 0);
    while i < count {
        assert!(
            late <= 10 * count,
            "{late} daemons were reaped after their remote call had ended"
        );
        let spawned_ns = monotonic_ns();
        let (_, mut daemon) = spawn_daemon(&dir, pid, &format!("daemon-{i}-{late}.log"));
        let (attach, killed_ns) = holding_the_engines_cpu(|| {
            let attach = events.next_ptrace(Instant::now() + Duration::from_secs(30), |e| {
                // Older events (a killed daemon's helper's later calls) are left in the socket.
                e.tgid == pid && e.tracer_tgid != 0 && e.at_ns >= spawned_ns
            });
            kill_spinning(&mut daemon, Duration::from_millis(200));
            (attach, monotonic_ns())
        });
        let attach = attach
            .unwrap_or_else(|| panic!("kill {i}: the daemon did not trace the engine in 30 s"));
        let detach = events
            .next_ptrace(Instant::now() + Duration::from_secs(5), |e| {
                e.pid == attach.pid && e.tracer_tgid == 0
            })
            .unwrap_or_else(|| {
                panic!(
                    "kill {i}: thread {} of the engine still traced 5 s after the kill: {:?}",
                    attach.pid,
                    tracers(pid)
                )
            });
        // A thread let go mid-call crashes the engine as soon as the call returns.
        std::thread::sleep(Duration::from_millis(200));
        assert!(alive(pid), "kill {i}: the engine died");
        assert!(
            tracers(pid).is_empty(),
            "kill {i}: {:?} trace the engine",
            tracers(pid)
        );
        assert_ne!(
            attach.tracer_tgid,
            daemon.id(),
            "kill {i}: the daemon traced the engine itself, not through a helper process"
        );
        wait_unmapped(
            pid,
            Duration::from_secs(15),
            &format!("15 s after kill {i} (lease {LEASE})"),
        );
        if detach.at_ns < killed_ns {
            late += 1;
            eprintln!(
                "chaos: kill {i}: the call had ended {:.0} µs before the daemon was reaped; again",
                (killed_ns - detach.at_ns) as f64 / 1e3
            );
            continue;
        }
        eprintln!(
            "chaos: kill {i}: the daemon ({}) killed and reaped {:.0} µs into a remote call by {} (its \
             helper); the engine's thread let go {:.0} µs after the kill",
            daemon.id(),
            (killed_ns - attach.at_ns) as f64 / 1e3,
            attach.tracer_tgid,
            (detach.at_ns - killed_ns) as f64 / 1e3
        );
        i += 1;
    }
    eprintln!("chaos: {count} kills mid-call, {late} after the call had ended");
    assert_stepped_throughout(&times, start_ns);
    assert!(alive(pid));
}

/// The engine restarted under a running daemon (killed, then started again with the same
/// command line): the daemon lets the old process go, finds the new one by its pattern and
/// attaches it, and the iterations it counts are the new engine's; the old one's series leave
/// /metrics.
#[test]
fn an_engine_restarted_under_the_daemon_is_attached_again() {
    require_root();
    let dir = tmpdir("restart");
    // Its own tag: a pattern of py_engine.py would attach this daemon to the toys of the
    // tests running beside it.
    let tag = format!("stallscope-restart-test-toy-{}", std::process::id());
    let mut engine = start_engine_tagged(None, &tag);
    let old = engine.id();
    let port = free_port();
    let cfg = config(&dir, old, port, 100_000);
    // Found by pattern (an explicit pid list would turn the patterns off).
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace(&format!("pids = [{old}]"), "pids = []")
        .replace(
            "engine_patterns = []",
            &format!("engine_patterns = [\"{tag}\"]"),
        );
    std::fs::write(&cfg, text).unwrap();
    let mut d = Daemon::start_with(&dir, port, cfg);
    let counting =
        |d: &Daemon, pid: u32| d.engine().is_some_and(|e| e["pid"] == pid) && d.iterations() > 50;
    d.wait_for(
        "the first engine's iterations",
        Duration::from_secs(60),
        |d| counting(d, old),
    );
    engine.child().kill().unwrap();
    engine.child().wait().unwrap();
    let restarted = start_engine_tagged(None, &tag);
    let new = restarted.id();
    d.wait_for(
        "the restarted engine's iterations",
        Duration::from_secs(60),
        |d| counting(d, new),
    );
    let metrics = d.get("/metrics");
    assert!(
        !metrics.contains(&format!("pid=\"{old}\"")),
        "the old engine's series are still exported"
    );
    assert!(metrics.contains(&format!("pid=\"{new}\"")));
    assert!(probe_mapped(new));
    assert!(d.stop().success());
    wait_unmapped(new, Duration::from_secs(10), "after a clean stop");
}

/// A tmpfs mounted for a test, unmounted on drop.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(at).unwrap();
        let ok = std::process::Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={size},mode=0700"),
                "stallscope-test",
            ])
            .arg(at)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mount tmpfs on {}", at.display());
        Tmpfs(at.to_path_buf())
    }

    fn read_only(&self) {
        let ok = std::process::Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0)
            .status()
            .unwrap()
            .success();
        assert!(ok, "remount {} read-only", self.0.display());
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// The state directory fills up (a 256 KiB tmpfs) under the iteration export: the daemon goes
/// on following the engine, serving its API and counting the failed writes in
/// stallscope_state_write_failures_total; a read-only state directory at start-up is one clear
/// error naming the file.
#[test]
fn a_full_or_read_only_state_directory_stops_nothing_silently() {
    require_root();
    let dir = tmpdir("full-state");
    let state = Tmpfs::mount(&dir.join("state"), "256k");
    let engine = start_engine();
    let port = free_port();
    let cfg = config(&state.0, engine.id(), port, 300);
    let mut d = Daemon::start_with(&dir, port, cfg.clone());
    let failed = |d: &Daemon, file: &str| {
        let name = format!("stallscope_state_write_failures_total{{file=\"{file}\"}}");
        metric(&d.get("/metrics"), &name)
    };
    // The export fills the disk (the model saved at the fit may fail before it: counted too).
    d.wait_for("the export's failed write", Duration::from_secs(120), |d| {
        failed(d, "export") >= 1.0
    });
    eprintln!(
        "failed writes: export {}, model {}, alert log {}",
        failed(&d, "export"),
        failed(&d, "model"),
        failed(&d, "alert_log")
    );
    let before = d.iterations();
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        d.iterations() > before + 100,
        "the daemon stopped following the engine once its disk was full ({before} -> {})",
        d.iterations()
    );
    assert!(d.log().contains("iteration export stopped"), "{}", d.log());
    assert!(d.stop().success(), "{}", d.log());

    state.read_only();
    let e = expect_failure(stallscope().arg("run").arg("--config").arg(&cfg));
    assert!(
        e.contains("cannot") && e.contains(&state.0.display().to_string()),
        "one error naming the read-only state directory: {e}"
    );
}
