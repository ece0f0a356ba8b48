//! stallscope: attach to a running LLM inference engine and find out why single
//! iterations stall. This binary only parses the command line and wires the library's
//! planes together.

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use probe_user::{
    cli, config,
    kernel_plane::{
        self,
        features::{Features, Hooks, KernelPaths},
    },
    sentinel,
};

/// Observability sidecar for LLM inference engines: attaches to a running engine with
/// no restart and accounts where each thread's time goes.
#[derive(Debug, Parser)]
#[command(name = "stallscope", version, about, long_about = None)]
struct Cli {
    /// Kernel BTF file (for kernels whose BTF is not at the default place).
    #[arg(
        long,
        global = true,
        env = "STALLSCOPE_BTF",
        default_value = "/sys/kernel/btf/vmlinux"
    )]
    btf: PathBuf,
    /// tracefs mount point.
    #[arg(
        long,
        global = true,
        env = "STALLSCOPE_TRACEFS",
        default_value = "/sys/kernel/tracing"
    )]
    tracefs: PathBuf,
    /// How the eBPF programs hook the kernel's tracepoints: `auto` (tp_btf where the kernel
    /// takes it, else raw_tracepoint) or `raw-tracepoint` (every hook).
    #[arg(
        long,
        global = true,
        env = "STALLSCOPE_HOOKS",
        value_enum,
        default_value = "auto"
    )]
    hooks: Hooks,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start the daemon: find the inference engines on this host, attach to them, run the
    /// sentinel (iterations, GBDT baseline, UCL alerts) and serve /metrics and the API until
    /// SIGINT/SIGTERM.
    Run {
        /// Configuration file laid over the embedded default (probe-user/config/default.toml):
        /// it holds only the keys it changes.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Watch this engine pid instead of discovering engines (repeatable).
        #[arg(long)]
        pid: Vec<u32>,
        /// Serve /metrics, /api/v1/status and /api/v1/alerts here (default from the config:
        /// 127.0.0.1:9464).
        #[arg(long)]
        listen: Option<std::net::SocketAddr>,
        /// Directory for fitted models and the alert log (default from the config).
        #[arg(long)]
        state_dir: Option<PathBuf>,
        /// Export metrics, alerts and deep dives to this OpenTelemetry collector over
        /// OTLP/HTTP (its base URL, http://HOST:4318; default from the config's [otlp]).
        #[arg(long)]
        otlp_endpoint: Option<String>,
        /// Check the configuration (the file laid over the embedded default, then the
        /// environment's overrides), print it as the daemon would run it, and exit.
        #[arg(long)]
        check_config: bool,
    },
    /// Fit the decode-latency baseline on an iteration table (LatencyPrism CSV schema).
    Fit(cli::model::FitArgs),
    /// Predict iteration durations (µs, one per input row) with a fitted baseline.
    Predict(cli::model::PredictArgs),
    /// Run the sentinel over a recorded iteration table (the daemon's export) with a
    /// configuration's [sentinel] settings: its fits and alerts, as JSON.
    Replay(cli::replay::ReplayArgs),
    /// Account every thread of a process over a window (on-CPU, run-queue wait, blocked
    /// time, context switches, top syscalls) and time its watched Python functions.
    Probe(cli::probe::ProbeArgs),
    /// Act on a serving group's daemons together.
    #[command(subcommand)]
    Fleet(cli::fleet::FleetCommand),
    /// Capture a bounded window of everything (raw scheduler and syscall events, wider
    /// Python probes, py-spy stack samples, host telemetry) into one Perfetto trace, and rank
    /// root causes against a normal reference window (`--baseline`). The target keeps running.
    DeepDive(cli::deep_dive::DeepDiveArgs),
    /// Inject one anomaly scenario (CPU, memory, I/O, network, Python, process pauses) into an
    /// engine for a bounded time; it always undoes itself (deadline, SIGINT/SIGTERM, parent
    /// death). `--list` names the scenarios.
    Inject(cli::inject::InjectArgs),
    /// Score detection on a running vLLM engine (`--vllm JSON`, or `--pid` with `--url`):
    /// drive load on its OpenAI endpoint, fit the baseline, inject each scenario N times at
    /// seeded random times and severities, and write precision, recall, F1, FPR and lag per
    /// strategy (trials.csv, scores.json, table.md, heatmap.png).
    Evaluate(cli::evaluate::EvaluateArgs),
    /// Trace what a live Python process runs on its GPU for a window (CUPTI, through an agent
    /// library loaded at a Python safe point and unloaded after): kernels, copies, API calls,
    /// their correlation, launch latency, busy share; optionally a Perfetto trace.
    Gpu(cli::gpu::GpuArgs),
    /// Print the Python stack of every thread of a process (a hang dump), sampled with py-spy
    /// without pausing it.
    Dump {
        /// The Python process.
        #[arg(long)]
        pid: i32,
        /// Print JSON (a list of threads with their frames, innermost first).
        #[arg(long)]
        json: bool,
    },
    /// Report which kernel features and privileges stallscope can use here, then load
    /// and attach every probe once to show how each hook attaches.
    Check,
}

fn main() -> ExitCode {
    env_logger::Builder::from_env(
        env_logger::Env::default().default_filter_or("info,py_spy=warn,remoteprocess=warn"),
    )
    .format_target(false)
    .init();
    // Every HTTP client of the process (the store's, OTLP's) shares one reqwest build with
    // rustls, which needs a process-wide crypto provider before the first client is built.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let paths = KernelPaths {
        btf: cli.btf,
        tracefs: cli.tracefs,
        hooks: cli.hooks,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Run {
            config,
            pid,
            listen,
            state_dir,
            otlp_endpoint,
            check_config,
        } => {
            let mut cfg = config::Config::load(config.as_deref())?;
            cfg.watch.pids.extend(pid);
            if let Some(l) = listen {
                cfg.http.listen = l;
            }
            if let Some(d) = state_dir {
                cfg.state.dir = d;
            }
            if let Some(url) = otlp_endpoint {
                cfg.otlp.endpoint = url;
                cfg.otlp.validate().context("invalid --otlp-endpoint")?;
            }
            if check_config {
                let mut shown = cfg.clone();
                if !shown.deep_dive.token.is_empty() {
                    shown.deep_dive.token = "(set)".into();
                }
                for v in shown.otlp.headers.values_mut() {
                    *v = "(set)".into();
                }
                println!("{shown:#?}");
                return Ok(());
            }
            sentinel::daemon::run(&cfg, &paths)
        }
        Command::Fit(args) => cli::model::fit(&args),
        Command::Inject(args) => cli::inject::run(&args),
        Command::Evaluate(args) => cli::evaluate::run(&args),
        Command::Predict(args) => cli::model::predict(&args),
        Command::Replay(args) => cli::replay::replay(&args),
        Command::Gpu(args) => cli::gpu::run(&args),
        Command::Probe(args) => rt.block_on(cli::probe::run(&args, &paths)),
        Command::Fleet(cmd) => cli::fleet::run(&cmd),
        Command::DeepDive(args) => rt.block_on(cli::deep_dive::run(&args, &paths)),
        Command::Dump { pid, json } => {
            let stacks = pyframe_tracer::sampling::Sampler::new(pid)?.sample()?;
            if json {
                println!("{}", serde_json::to_string(&stacks)?);
            } else {
                for t in &stacks {
                    let tid = t.tid.map_or("?".to_string(), |t| t.to_string());
                    let name = t.name.as_deref().unwrap_or("");
                    let state = if t.active { "active" } else { "idle" };
                    println!(
                        "thread {tid} {name} ({state}{})",
                        if t.owns_gil { ", holds the GIL" } else { "" }
                    );
                    for f in &t.frames {
                        println!("    {} ({}:{})", f.func, f.file, f.line);
                    }
                }
            }
            Ok(())
        }
        Command::Check => {
            let f = Features::detect(&paths);
            for (what, status, detail) in f.describe() {
                println!("{what:<36} {status:<7} {detail}");
            }
            f.require()?;
            let plane = kernel_plane::KernelPlane::load(&f)?;
            for h in plane.hooks() {
                println!(
                    "{:<36} ok   {:?} ({})",
                    format!("hook {}", h.tracepoint),
                    h.kind,
                    h.program
                );
            }
            Ok(())
        }
    }
}
