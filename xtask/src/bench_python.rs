//! `cargo xtask bench` part 2: the Python plane's cost on real CPython targets (pyenv), measured A/B
//! interleaved in one run, and the ring's throughput.

use std::{
    io::{BufRead, BufReader, Lines},
    process::{Child, ChildStdout, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use pyframe_tracer::{ring::Record, ring::Ring, AttachOptions, Framework, Session};

const VERSIONS: [&str; 4] = ["3.10", "3.11", "3.12", "3.13"];
/// Attached rounds per writer and version (each after a round without the probe): enough
/// pairs for the unwatched calls' change to be resolved to about 2 %.
const PAIRS: usize = 30;
/// Held/detached cycles per process for the unwatched calls alone.
const CYCLES: usize = 8;
/// Processes per version for the unwatched calls alone.
const PROCESSES: usize = 4;
/// A target's age before its unwatched calls are measured: past the speed-up of a young
/// process.
const YOUTH: Duration = Duration::from_secs(10);
/// A state's periods are measured this long after the attach or detach that began it: early
/// (an attach's disturbance has been seen to last past 2 s on 3.11-3.13) and late.
const SETTLE: [Duration; 2] = [Duration::from_secs(2), Duration::from_secs(6)];
/// Rounds per period (their median is its level).
const PERIOD_ROUNDS: usize = 5;
/// About one held/detached cycle: the control's two periods are this far apart.
const CYCLE: Duration = Duration::from_secs(13);

struct Target {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    pid: i32,
}

impl Target {
    /// `mode`: "both" (each round calls `watched`, then `unwatched`) or "unwatched".
    fn start(version: &str, mode: &str) -> Result<Target> {
        let script = crate::root().join("tests/targets/py_bench.py");
        let mut child =
            Command::new(crate::setup::pyenv_python(version).with_context(|| {
                format!("CPython {version} not in pyenv (run cargo xtask setup)")
            })?)
            .arg(script)
            .args(["200000", mode])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let ready = lines.next().context("target said nothing")??;
        let pid = ready.trim_start_matches("ready ").parse()?;
        Ok(Target { child, lines, pid })
    }

    /// The first round that started after now (older lines are still in the pipe and are
    /// skipped).
    fn round(&mut self) -> Result<Round> {
        let now = sys_util::clock::monotonic_ns() as f64;
        loop {
            let line = self.lines.next().context("target ended")??;
            let v: Vec<f64> = line
                .split(' ')
                .skip(1)
                .map(|x| x.parse::<f64>())
                .collect::<Result<_, _>>()?;
            anyhow::ensure!(v.len() == 5, "bad round line {line:?}");
            if v[0] > now {
                return Ok(Round {
                    watched: v[3],
                    unwatched: v[4],
                });
            }
        }
    }

    /// The levels of unwatched calls [`SETTLE`]'s delays from now, each a [`Target::period`].
    fn periods(&mut self) -> Result<[f64; 2]> {
        let start = Instant::now();
        let mut levels = [0.0; 2];
        for (level, delay) in levels.iter_mut().zip(SETTLE) {
            std::thread::sleep(delay.saturating_sub(start.elapsed()));
            *level = self.period()?;
        }
        Ok(levels)
    }

    /// The level of unwatched calls over the next [`PERIOD_ROUNDS`] rounds, ns per call: their
    /// median.
    fn period(&mut self) -> Result<f64> {
        let rounds = (0..PERIOD_ROUNDS)
            .map(|_| Ok(self.round()?.unwatched))
            .collect::<Result<Vec<_>>>()?;
        Ok(median(rounds))
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One round of the target: ns per call by the thread's CPU clock, which leaves out the
/// time the thread waited for a CPU (the wall clock's rounds spread over ±15 % on 2 vCPUs).
#[derive(Clone, Copy)]
struct Round {
    watched: f64,
    unwatched: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The probe's record writers, each measured as its own arm: the compiled one
/// (`pyframe-native`, loaded into the target) and the pure-Python fallback.
const WRITERS: [&str; 2] = ["native", "python"];

/// The compiled record writer's library.
fn native_writer() -> Result<std::path::PathBuf> {
    pyframe_tracer::native::library().context(
        "the compiled writer (libstallscope_pyprobe.so) is not built: cargo build --release",
    )
}

/// One writer's rounds with the probe attached, each beside the round without it just
/// before, and the pauses of its attaches.
#[derive(Default)]
struct Arm {
    pairs: Vec<(Round, Round)>,
    pauses: Vec<f64>,
    mechanism: String,
}

impl Arm {
    /// Cost per watched call, ns: the medians' difference.
    fn watched_cost(&self) -> (f64, f64) {
        let base = median(self.pairs.iter().map(|(b, _)| b.watched).collect());
        (
            base,
            median(self.pairs.iter().map(|(_, r)| r.watched).collect()),
        )
    }
}

/// The change of `unwatched` calls over pairs of rounds, %: mean and 95 % CI half-width of
/// the per-pair ratios.
fn unwatched_change(pairs: &[(Round, Round)]) -> (f64, f64) {
    let ratios: Vec<f64> = pairs
        .iter()
        .map(|(b, r)| change(r.unwatched, b.unwatched))
        .collect();
    crate::bench_sentinel::mean_ci95(&ratios)
}

/// One round with `__main__:watched` watched through `writer`, a reader draining the ring
/// every 2 ms meanwhile, into `arm` beside `base`, the round before without the probe.
fn watched_round(
    t: &mut Target,
    version: &str,
    writer: &str,
    base: Round,
    arm: &mut Arm,
) -> Result<()> {
    let options = AttachOptions {
        specs: vec!["__main__:watched".parse()?],
        framework: Framework::Named("generic".into()),
        // One thread calls 3-7 M watched functions a second with the compiled writer: a lane
        // holds 2 ms of them between the reader's drains (32 MiB).
        lanes: 2,
        lane_capacity: 1 << 17,
        native: match writer {
            "native" => Some(native_writer()?),
            _ => None,
        },
        ..AttachOptions::default()
    };
    let session = Session::attach(t.pid, options)?;
    anyhow::ensure!(
        session.writer == writer,
        "{version}: the {writer} writer was asked for, the probe used the {} one ({})",
        session.writer,
        session.writer_note.as_deref().unwrap_or("no reason given")
    );
    arm.pauses.push(session.pause.as_secs_f64() * 1e6);
    arm.mechanism.clone_from(&session.probes[0].mechanism);
    let done = std::sync::atomic::AtomicBool::new(false);
    let round = std::thread::scope(|s| -> Result<Round> {
        let reader = s.spawn(|| {
            let mut sink = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                session.drain(&mut sink);
                sink.clear();
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        let r = t.round();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        reader.join().expect("reader");
        r
    })?;
    arm.pairs.push((base, round));
    let lost = session.lost_records();
    session.detach()?;
    anyhow::ensure!(lost == 0, "{version} {writer}: {lost} records lost");
    Ok(())
}

/// Runs the Python-plane benchmarks and prints Markdown.
pub fn run() -> Result<()> {
    println!("## Python plane (`cargo xtask bench`)\n");
    println!(
        "### Cost per call and injection pause (A/B interleaved, {PAIRS} rounds per arm and version)\n"
    );
    println!("`tests/targets/py_bench.py` times 200k calls of `watched(x)` and of `unwatched(x)` per round (the");
    println!("median of 10 chunks by the thread's CPU clock). Each attached round (`__main__:watched` watched,");
    println!("by each record writer in turn) follows a round without the probe, its pair; each is the first");
    println!("round that starts after the attach or detach returned. Watched: the medians over the pairs.");
    println!("Unwatched: the mean change over");
    println!("the pairs with its 95 % CI; \"control\" is the same over pairs of two rounds without the probe (the");
    println!("round between them attached), what the measurement alone shows. Pause = time a target thread was");
    println!("stopped by ptrace during the attach.\n");
    println!("| CPython | writer | mechanism | watched: base → with probe (ns/call) | cost per watched call | unwatched with probe: change (95 % CI) | control | pause p50 / max |");
    println!("|---|---|---|---|---:|---:|---:|---:|");
    for version in versions()? {
        let mut t = Target::start(version, "both")?;
        t.round()?; // warm-up
        let mut bases = Vec::new();
        let mut arms: Vec<Arm> = WRITERS.iter().map(|_| Arm::default()).collect();
        for pair in 0..PAIRS {
            // The writers' order alternates, so neither always follows the other.
            for i in 0..WRITERS.len() {
                let i = (i + pair) % WRITERS.len();
                let base = t.round()?;
                bases.push(base);
                watched_round(&mut t, version, WRITERS[i], base, &mut arms[i])?;
            }
        }
        let control: Vec<(Round, Round)> = bases.windows(2).map(|w| (w[0], w[1])).collect();
        let (cm, cw) = unwatched_change(&control);
        for (writer, arm) in WRITERS.iter().zip(arms) {
            let (aw, bw) = arm.watched_cost();
            let (um, uw) = unwatched_change(&arm.pairs);
            println!(
                "| {version} | {writer} | {} | {aw:.1} → {bw:.1} | {:.0} ns | {um:+.2} % (±{uw:.2}) | {cm:+.2} % (±{cw:.2}) | {:.0} µs / {:.0} µs |",
                arm.mechanism,
                bw - aw,
                median(arm.pauses.clone()),
                arm.pauses.iter().cloned().fold(0.0, f64::max)
            );
        }
    }
    println!();
    unwatched_alone()?;
    ring_throughput()
}

/// Unwatched calls with `__main__:watched` watched but never called: what the mechanisms
/// alone do to other code, apart from the record traffic of a thread that also calls a
/// watched function millions of times a second (the table above).
///
/// Rounds of one long-lived process, the probe attached and detached in turn. Fresh processes
/// cannot resolve this: one fresh process's change from its first round spreads over about
/// ±14 % (SD) as it speeds up over its first seconds, and 80 processes per arm left a 95 % CI of
/// ±4.4 %. Past its youth, a process's loop holds a level and moves to another at events that
/// allocate (an attach or a detach is one), so a held period is compared with the mean of the
/// detached periods on either side (which cancels a linear drift), over many cycles and a few
/// processes (each its own randomised addresses). Each state is measured twice, 2 s and 6 s
/// after its change: on 3.11-3.13 the loop ran about 2 % slower 2 s after an attach than 2 s
/// after a detach, and not 6 s after, while the probe run in the process without the
/// injection showed no change at once (`tests/tools/probe_cost.py`). The probe's residue,
/// what the attach leaves once detached (modules loaded, the ring's pages), is the first
/// detached period over the period before the first attach; its control is two periods
/// before any attach, a cycle apart.
///
/// `STALLSCOPE_PYTHON_CYCLES` sets the held/detached cycles per process (default 8),
/// `STALLSCOPE_PYTHON_PROCESSES` the processes per version (default 4) and
/// `STALLSCOPE_PYTHON_VERSIONS` the CPython versions (comma-separated; default 3.10-3.13).
pub fn unwatched_alone() -> Result<()> {
    let cycles = crate::env_count("STALLSCOPE_PYTHON_CYCLES", CYCLES, "cycles")?;
    let processes = crate::env_count("STALLSCOPE_PYTHON_PROCESSES", PROCESSES, "processes")?;
    let versions = versions()?;
    let [early, late] = SETTLE.map(|d| d.as_secs());
    println!("### Unwatched calls, the watched function not called ({processes} processes × {cycles} cycles per version)\n");
    println!(
        "`py_bench.py` with its rounds calling `unwatched` only. Each process runs {} s, then in",
        YOUTH.as_secs()
    );
    println!("turn the probe attached (`__main__:watched` watched, compiled writer) and detached. Each state");
    println!("has two periods, {early} s and {late} s after its change, each period's level the median of {PERIOD_ROUNDS} rounds.");
    println!(
        "Held: a held period over the mean of the detached periods as long after the detaches on"
    );
    println!(
        "either side; first round: the first round after the attach over the late period before."
    );
    println!(
        "Residue: the first detached period over the period before the first attach; control: two"
    );
    println!("periods before any attach, a cycle apart (both late). Mean change, 95 % CI over all cycles");
    println!(
        "(residue and control: over the processes); per process: its mean held change, late.\n"
    );
    println!("| CPython | mechanism | unwatched: base (ns/call) | first round after the attach | held, {early} s after | held, {late} s after | residue | control | held {late} s after, per process |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---|");
    for version in &versions {
        let mut held: [Vec<f64>; 2] = Default::default();
        let mut first = Vec::new();
        let mut residue = Vec::new();
        let mut control = Vec::new();
        let mut base = Vec::new();
        let mut mechanism = String::new();
        for _ in 0..processes {
            let mut t = Target::start(version, "unwatched")?;
            std::thread::sleep(YOUTH);
            let before = t.period()?;
            std::thread::sleep(CYCLE);
            // Levels of the last detached state: [early, late]; before any attach, the late
            // one alone is known (and is the early one's stand-in in the first cycle).
            let late = t.period()?;
            let mut detached = [late, late];
            control.push(change(late, before));
            base.push(late);
            for cycle in 0..cycles {
                let s = Session::attach(
                    t.pid,
                    AttachOptions {
                        specs: vec!["__main__:watched".parse()?],
                        framework: Framework::Named("generic".into()),
                        native: Some(native_writer()?),
                        ..AttachOptions::default()
                    },
                )?;
                mechanism.clone_from(&s.probes[0].mechanism);
                first.push(change(t.round()?.unwatched, detached[1]));
                let h = t.periods()?;
                detach_empty(s, version)?;
                let after = t.periods()?;
                if cycle == 0 {
                    residue.push(change(after[1], detached[1]));
                }
                for k in 0..2 {
                    held[k].push(change(h[k], (detached[k] + after[k]) / 2.0));
                }
                detached = after;
            }
        }
        let ci = |v: &[f64]| {
            let (m, w) = crate::bench_sentinel::mean_ci95(v);
            format!("{m:+.2} % (±{w:.2})")
        };
        println!(
            "| {version} | {mechanism} | {:.1} | {} | {} | {} | {} | {} | {} |",
            median(base),
            ci(&first),
            ci(&held[0]),
            ci(&held[1]),
            ci(&residue),
            ci(&control),
            held[1]
                .chunks(cycles)
                .map(|p| format!("{:+.1}", crate::bench_sentinel::mean_ci95(p).0))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    println!();
    Ok(())
}

/// `a` over `b`, % change.
fn change(a: f64, b: f64) -> f64 {
    (a / b - 1.0) * 100.0
}

/// Detaches `session`, whose watched function was never called: it must have no records.
fn detach_empty(session: Session, version: &str) -> Result<()> {
    let mut records = Vec::new();
    session.drain(&mut records);
    session.detach()?;
    anyhow::ensure!(records.is_empty(), "{version}: records from uncalled code");
    Ok(())
}

/// The CPython versions to measure, `STALLSCOPE_PYTHON_VERSIONS` or all of [`VERSIONS`].
fn versions() -> Result<Vec<&'static str>> {
    let Ok(s) = std::env::var("STALLSCOPE_PYTHON_VERSIONS") else {
        return Ok(VERSIONS.to_vec());
    };
    s.split(',')
        .map(|v| {
            VERSIONS
                .iter()
                .copied()
                .find(|k| *k == v.trim())
                .with_context(|| {
                    format!("STALLSCOPE_PYTHON_VERSIONS: {v:?} is not one of {VERSIONS:?}")
                })
        })
        .collect()
}

/// Records per second through the ring's reader (the Rust side), producer in another thread.
fn ring_throughput() -> Result<()> {
    println!("### Ring throughput (reader side)\n");
    let path = std::env::temp_dir().join(format!("stallscope-bench-ring-{}", std::process::id()));
    let mut ring = Ring::create(&path, 2, 65536)?;
    let reader = Ring::open(&path)?;
    std::fs::remove_file(&path)?;
    let total = 20_000_000u64;
    let rec = Record {
        seq: 0,
        probe: 1,
        exception: false,
        tid: 1,
        enter_ns: 1,
        exit_ns: 2,
        present: 0xff,
        fields: [7; 8],
    };
    let start = Instant::now();
    let (read, lost) = std::thread::scope(|s| {
        let producer = s.spawn(move || {
            let mut pushed = 0u64;
            while pushed < total {
                if ring.push(0, &rec) {
                    pushed += 1;
                }
            }
        });
        let mut read = 0u64;
        let mut buf = Vec::with_capacity(65536);
        while read < total {
            buf.clear();
            read += reader.drain(&mut buf) as u64;
        }
        producer.join().expect("producer");
        (read, reader.lost())
    });
    let secs = start.elapsed().as_secs_f64();
    println!("| records | seconds | records/s | MB/s | lost (full-ring retries) |\n|---:|---:|---:|---:|---:|");
    println!(
        "| {read} | {secs:.2} | {:.1} M | {:.0} | {lost} |\n",
        read as f64 / secs / 1e6,
        read as f64 * 128.0 / secs / 1e6
    );
    Ok(())
}
