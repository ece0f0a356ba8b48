//! `stallscope fit` and `stallscope predict`: the baseline offline, on iteration tables in the
//! LatencyPrism schema (what `[state] iterations_csv` exports).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};
use model::{dataset::parse_csv, Baseline, BaselineParams, Fingerprint, Sample};

/// `stallscope fit`.
#[derive(Debug, Args)]
pub struct FitArgs {
    /// Iterations with duration_us, batch_size, avg_input_length, avg_output_length
    /// (optional num_tokens; without it, tables with job_name, start_ts and
    /// max_output_length get each step's tokens reconstructed from its job's next row).
    #[arg(long)]
    csv: PathBuf,
    /// Where to write the model (JSON).
    #[arg(short, long)]
    output: PathBuf,
    /// Fingerprint: the framework the iterations come from.
    #[arg(long, default_value = "offline")]
    framework: String,
    /// Fingerprint: the served model.
    #[arg(long, default_value = "unknown")]
    model_name: String,
    /// Fingerprint: the hardware.
    #[arg(long, default_value = "unknown")]
    hardware: String,
}

/// Output format of `stallscope predict`.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Format {
    /// A `predicted_us` header, then one value per line.
    Csv,
    /// One JSON array.
    Json,
}

/// `stallscope predict`.
#[derive(Debug, Args)]
pub struct PredictArgs {
    /// A model written by `stallscope fit` (or by the daemon in its state directory).
    #[arg(long)]
    model: PathBuf,
    /// Iterations with batch_size, avg_input_length, avg_output_length (optional num_tokens;
    /// without it, tables with job_name, start_ts and max_output_length get each step's
    /// tokens reconstructed from its job's next row).
    #[arg(long)]
    csv: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value = "csv")]
    format: Format,
}

fn read(path: &Path, what: &str) -> Result<String> {
    std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the {what} {}", path.display()))
}

/// Fits a baseline and writes it; prints its out-of-fold accuracy and UCL as JSON.
pub fn fit(a: &FitArgs) -> Result<()> {
    let rows = parse_csv(&read(&a.csv, "iteration table")?, true)
        .with_context(|| format!("in {}", a.csv.display()))?;
    let samples: Vec<Sample> = rows
        .iter()
        .map(|r| Sample {
            workload: r.workload,
            duration_us: r.duration_us.expect("parse_csv requires it"),
        })
        .collect();
    let fp = Fingerprint {
        framework: a.framework.clone(),
        model: a.model_name.clone(),
        hardware: a.hardware.clone(),
    };
    let b = Baseline::fit(&samples, &BaselineParams::default(), fp)?;
    std::fs::write(&a.output, b.to_json())
        .with_context(|| format!("cannot write the model to {}", a.output.display()))?;
    println!(
        "{}",
        serde_json::json!({
            "samples": b.samples,
            "oof_accuracy": b.oof_accuracy,
            "ucl": b.ucl,
            "model": a.output,
        })
    );
    Ok(())
}

/// Prints one predicted duration (µs) per input row, in order.
pub fn predict(a: &PredictArgs) -> Result<()> {
    let b = Baseline::from_json(&read(&a.model, "model file")?)
        .with_context(|| format!("in {}", a.model.display()))?;
    let rows = parse_csv(&read(&a.csv, "iteration table")?, false)
        .with_context(|| format!("in {}", a.csv.display()))?;
    let preds: Vec<f64> = rows.iter().map(|r| b.predict(&r.workload)).collect();
    match a.format {
        Format::Json => println!("{}", serde_json::to_string(&preds)?),
        Format::Csv => {
            use std::io::Write;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            writeln!(out, "predicted_us")?;
            for p in preds {
                writeln!(out, "{p:.3}")?;
            }
        }
    }
    Ok(())
}
