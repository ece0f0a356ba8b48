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
/// Attached rounds per writer and version (each after a round without the probe).
const PAIRS: usize = 10;

struct Target {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    pid: i32,
}

impl Target {
    fn start(version: &str) -> Result<Target> {
        let script = crate::root().join("tests/targets/py_bench.py");
        let mut child =
            Command::new(crate::setup::pyenv_python(version).with_context(|| {
                format!("CPython {version} not in pyenv (run cargo xtask setup)")
            })?)
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()?;
        let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
        let ready = lines.next().context("target said nothing")??;
        let pid = ready.trim_start_matches("ready ").parse()?;
        Ok(Target { child, lines, pid })
    }

    /// (watched ns/call, unwatched ns/call) of the first round that started after now (older lines are
    /// still in the pipe and are skipped).
    fn round(&mut self) -> Result<(f64, f64)> {
        let now = sys_util::clock::monotonic_ns() as f64;
        loop {
            let line = self.lines.next().context("target ended")??;
            let v: Vec<f64> = line
                .split(' ')
                .skip(1)
                .map(|x| x.parse::<f64>())
                .collect::<Result<_, _>>()?;
            anyhow::ensure!(v.len() == 3, "bad round line {line:?}");
            if v[0] > now {
                return Ok((v[1], v[2]));
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

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// The probe's record writers, each measured as its own arm: the compiled one
/// (`pyframe-native`, loaded into the target) and the pure-Python fallback.
const WRITERS: [&str; 2] = ["native", "python"];

/// One writer's rounds with the probe attached, and the pauses of its attaches.
#[derive(Default)]
struct Arm {
    watched: Vec<f64>,
    unwatched: Vec<f64>,
    pauses: Vec<f64>,
    mechanism: String,
}

/// One round with `__main__:watched` watched through `writer`, a reader draining the ring
/// every 2 ms meanwhile, into `arm`.
fn watched_round(t: &mut Target, version: &str, writer: &str, arm: &mut Arm) -> Result<()> {
    let options = AttachOptions {
        specs: vec!["__main__:watched".parse()?],
        framework: Framework::Named("generic".into()),
        // One thread calls 3-7 M watched functions a second with the compiled writer: a lane
        // holds 2 ms of them between the reader's drains (32 MiB).
        lanes: 2,
        lane_capacity: 1 << 17,
        native: match writer {
            "native" => Some(pyframe_tracer::native::library().context(
                "the compiled writer (libstallscope_pyprobe.so) is not built: cargo build --release",
            )?),
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
    let (w, u) = std::thread::scope(|s| -> Result<(f64, f64)> {
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
    arm.watched.push(w);
    arm.unwatched.push(u);
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
    println!("`tests/targets/py_bench.py` times 200k calls of `watched(x)` and of `unwatched(x)` per round. Each");
    println!("attached round (`__main__:watched` watched, by each record writer in turn) follows a round without");
    println!("the probe; each is the first round that starts after the attach or detach returned. Pause = time a");
    println!("target thread was stopped by ptrace during the attach.\n");
    println!("| CPython | writer | mechanism | watched: base → with probe (ns/call) | cost per watched call | unwatched: base → with probe | pause p50 / max |");
    println!("|---|---|---|---|---:|---:|---:|");
    for version in VERSIONS {
        let mut t = Target::start(version)?;
        t.round()?; // warm-up
        let (mut base_w, mut base_u) = (vec![], vec![]);
        let mut arms: Vec<Arm> = WRITERS.iter().map(|_| Arm::default()).collect();
        for pair in 0..PAIRS {
            // The writers' order alternates, so neither always follows the other.
            for i in 0..WRITERS.len() {
                let i = (i + pair) % WRITERS.len();
                let (w, u) = t.round()?;
                base_w.push(w);
                base_u.push(u);
                watched_round(&mut t, version, WRITERS[i], &mut arms[i])?;
            }
        }
        let (aw, au) = (median(base_w.clone()), median(base_u.clone()));
        for (writer, arm) in WRITERS.iter().zip(arms) {
            let (bw, bu) = (median(arm.watched), median(arm.unwatched));
            println!(
                "| {version} | {writer} | {} | {aw:.1} → {bw:.1} | {:.0} ns | {au:.1} → {bu:.1} ({:+.1} %) | {:.0} µs / {:.0} µs |",
                arm.mechanism,
                bw - aw,
                (bu / au - 1.0) * 100.0,
                median(arm.pauses.clone()),
                arm.pauses.iter().cloned().fold(0.0, f64::max)
            );
        }
    }
    println!();
    ring_throughput()
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
