//! `stallscope inject`: run one anomaly scenario against an engine for a bounded time. It
//! always undoes itself: at the deadline, on SIGINT/SIGTERM, and when its parent dies.

use std::time::Duration;

use anyhow::Result;

use crate::os::stop_flag;

/// Options of `stallscope inject`.
#[derive(Debug, clap::Args)]
pub struct InjectArgs {
    /// The scenario (`--list` names them).
    #[arg(required_unless_present = "list")]
    pub scenario: Option<String>,
    /// List the scenarios, each with what it stresses and what --intensity means.
    #[arg(long)]
    pub list: bool,
    /// How long to hold the stress.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// Severity in (0, 1] (see --list for each scenario's meaning).
    #[arg(long, default_value_t = 0.5)]
    pub intensity: f64,
    /// CPUs to stress, e.g. `0-1,3` (cpu-contention; default: the engine's allowed CPUs).
    #[arg(long)]
    pub cpus: Option<String>,
    /// The engine process.
    #[arg(long)]
    pub pid: Option<u32>,
    /// The engine's API port (network-delay).
    #[arg(long)]
    pub port: Option<u16>,
    /// `MODULE:QUALNAME` to slow (python-sync-stall; default vLLM's Scheduler.schedule).
    #[arg(long)]
    pub function: Option<String>,
    /// Allow scenarios that change device settings (clock-lock). Never on a lent or shared
    /// machine.
    #[arg(long)]
    pub allow_device_settings: bool,
    /// The engine's decode step (e.g. `25ms`): time magnitudes are then set in steps (see
    /// --list), so one intensity means the same slowdown on a fast and a slow engine.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub engine_step: Option<Duration>,
    /// Print the report as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Runs the scenario, or lists them.
pub fn run(args: &InjectArgs) -> Result<()> {
    if args.list {
        for s in anomaly_suite::SCENARIOS {
            println!("{:<22} {}", s.name, s.stresses);
            println!("{:<22} intensity: {}", "", s.intensity);
        }
        return Ok(());
    }
    let name = args.scenario.as_deref().unwrap_or_default();
    let scenario = anomaly_suite::scenario(name)?;
    let params = anomaly_suite::Params {
        duration: args.duration,
        intensity: args.intensity,
        cpus: args
            .cpus
            .as_deref()
            .map(anomaly_suite::parse_cpu_list)
            .transpose()?
            .unwrap_or_default(),
        pid: args.pid,
        port: args.port,
        function: args.function.clone(),
        allow_device_settings: args.allow_device_settings,
        step: args.engine_step,
    };
    stop_flag::install(true);
    let report = scenario.run(&params, &stop_flag::STOP)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        println!(
            "{}: {} ({:.2} s, after {:.0} ms of setup{})",
            report.scenario,
            report.mechanism,
            report.held_ms / 1e3,
            report.setup_ms,
            if stop_flag::requested() {
                ", stopped early by a signal"
            } else {
                ""
            }
        );
    }
    Ok(())
}
