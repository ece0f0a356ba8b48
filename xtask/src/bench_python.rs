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
/// Processes per arm and version for the unwatched calls alone, each one pair.
const ALONE_PAIRS: usize = 20;
/// A fresh target's warm-up before its rounds are measured.
const WARM_UP: Duration = Duration::from_secs(1);
/// The later round starts this long after the attach (or the moment it would have been).
const SETTLED: Duration = Duration::from_secs(3);

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
        .map(|(b, r)| (r.unwatched / b.unwatched - 1.0) * 100.0)
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
/// A loop's speed in one process moves by several % whenever anything allocates (measured:
/// one 3.11 process ran the loop at 29.8, 30.9 and 28.0 ns per call before, during and after
/// an attach, its level changing at each event and holding in between), and a young process
/// speeds up over its first seconds. So each pair is a fresh process (its own randomised
/// addresses), and the processes take turns in three arms with the same timeline: the probe
/// attached after the first round and held, the probe attached and at once detached (what the
/// attach leaves behind without a probe in place: the modules it loaded, the allocations it
/// made), or nothing done. Each arm's effect is the difference of its mean change and the
/// last arm's.
///
/// `STALLSCOPE_PYTHON_ALONE_PAIRS` sets the processes per arm (default 20) and
/// `STALLSCOPE_PYTHON_VERSIONS` the CPython versions (comma-separated; default 3.10-3.13).
pub fn unwatched_alone() -> Result<()> {
    let per_arm = alone_pairs()?;
    let versions = versions()?;
    println!("### Unwatched calls, the watched function not called ({per_arm} processes per arm and version)\n");
    println!("`py_bench.py` with its rounds calling `unwatched` only, a fresh process each time: {} s of", WARM_UP.as_secs());
    println!(
        "warm-up, a round, then in turn the probe attached (`__main__:watched` watched, compiled"
    );
    println!("writer) and held, the probe attached and at once detached, or nothing done; then the first");
    println!("round after that and the first {} s later, each over the first round. Effect: an arm's mean", SETTLED.as_secs());
    println!("change minus the third arm's, with its 95 % CI.\n");
    println!("| CPython | mechanism | unwatched: base (ns/call) | right after: attached / detached / not | effect attached / detached | {} s later: attached / detached / not | effect attached / detached |", SETTLED.as_secs());
    println!("|---|---|---:|---:|---:|---:|---:|");
    for version in &versions {
        // [arm][point]: arm 0 attached, 1 attached and detached, 2 nothing; point 0 right
        // after, 1 later.
        let mut pairs: [[Vec<(Round, Round)>; 2]; 3] = Default::default();
        let mut mechanism = String::new();
        for i in 0..3 * per_arm {
            let arm = i % 3;
            let mut t = Target::start(version, "unwatched")?;
            std::thread::sleep(WARM_UP);
            let base = t.round()?;
            let session = if arm < 2 {
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
                Some(s)
            } else {
                None
            };
            let held = match session {
                Some(s) if arm == 1 => {
                    detach_empty(s, version)?;
                    None
                }
                s => s,
            };
            pairs[arm][0].push((base, t.round()?));
            std::thread::sleep(SETTLED);
            pairs[arm][1].push((base, t.round()?));
            if let Some(s) = held {
                detach_empty(s, version)?;
            }
        }
        let cell = |point: usize| {
            let c: Vec<(f64, f64)> = pairs.iter().map(|a| unwatched_change(&a[point])).collect();
            let effect = |arm: usize| {
                format!(
                    "{:+.2} % (±{:.2})",
                    c[arm].0 - c[2].0,
                    c[arm].1.hypot(c[2].1)
                )
            };
            format!(
                "{:+.2} / {:+.2} / {:+.2} % | {} / {}",
                c[0].0,
                c[1].0,
                c[2].0,
                effect(0),
                effect(1)
            )
        };
        println!(
            "| {version} | {mechanism} | {:.1} | {} | {} |",
            median(pairs[2][0].iter().map(|(b, _)| b.unwatched).collect()),
            cell(0),
            cell(1),
        );
    }
    println!();
    Ok(())
}

/// Detaches `session`, whose watched function was never called: it must have no records.
fn detach_empty(session: Session, version: &str) -> Result<()> {
    let mut records = Vec::new();
    session.drain(&mut records);
    session.detach()?;
    anyhow::ensure!(records.is_empty(), "{version}: records from uncalled code");
    Ok(())
}

/// Processes per arm, `STALLSCOPE_PYTHON_ALONE_PAIRS` or [`ALONE_PAIRS`].
fn alone_pairs() -> Result<usize> {
    crate::env_count("STALLSCOPE_PYTHON_ALONE_PAIRS", ALONE_PAIRS, "processes")
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
