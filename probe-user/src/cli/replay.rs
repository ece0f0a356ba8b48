//! `stallscope replay`: the sentinel over a recorded iteration table (what `[state]
//! iterations_csv` exports), with the `[sentinel]` settings of a configuration: when it would
//! have fitted and what it would have alerted on. Fits run at once where the daemon runs them
//! in the background (it keeps the previous model for the second or two a fit takes), so
//! alerts can differ from the recorded run's by a few iterations around a refit.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use model::{dataset::parse_csv, Baseline, Fingerprint, Iteration, Sentinel, Stage};
use serde_json::json;

/// `stallscope replay`.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The iteration table (with start_ts, duration_us, the workload columns and stage; rows
    /// without a stage count as decode).
    #[arg(long)]
    csv: PathBuf,
    /// The configuration whose [sentinel] settings to replay with (as `stallscope run
    /// --config`; default: the embedded default).
    #[arg(long)]
    config: Option<PathBuf>,
}

pub fn replay(a: &ReplayArgs) -> Result<()> {
    let cfg = crate::config::Config::load(a.config.as_deref())?;
    let params = cfg.sentinel.params();
    let text = std::fs::read_to_string(&a.csv)
        .with_context(|| format!("cannot read the iteration table {}", a.csv.display()))?;
    let rows = parse_csv(&text, true)?;
    if rows.iter().any(|r| r.start_us.is_none()) {
        bail!(
            "{}: replay needs the start_ts column (µs since the epoch), as the daemon's export has",
            a.csv.display()
        );
    }
    let fingerprint = Fingerprint {
        framework: "replay".into(),
        model: a.csv.display().to_string(),
        hardware: String::new(),
    };
    let mut s = Sentinel::new(params, fingerprint.clone(), None);
    let (mut fits, mut alerts) = (Vec::new(), Vec::new());
    let mut open: Option<usize> = None;
    let (mut modelled, mut flagged, mut unseen) = (0usize, 0usize, 0usize);
    for (i, r) in rows.iter().enumerate() {
        let start_ns = (r.start_us.expect("checked") * 1e3) as u64;
        let duration_ns = (r.duration_us.expect("checked") * 1e3) as u64;
        let it = Iteration {
            start_ns,
            end_ns: start_ns + duration_ns,
            stage: r.stage.unwrap_or(Stage::Decode),
            workload: r.workload,
        };
        let v = s.observe(&it);
        if v.predicted_us.is_some() {
            modelled += 1;
        }
        unseen += usize::from(v.unseen_batch);
        if v.alert_started {
            alerts.push(json!({
                "row": i,
                "start_ts_us": r.start_us,
                "modelled_before": modelled - 1,
                "moving_mean": v.moving_mean,
                "window_slowdown": v.window_slowdown,
                "ucl": v.ucl,
            }));
            open = Some(alerts.len() - 1);
        }
        if s.alerting() && v.predicted_us.is_some() {
            flagged += 1;
            if let Some(a) = open {
                let n = alerts[a]["iterations"].as_u64().unwrap_or(0) + 1;
                alerts[a]["iterations"] = json!(n);
            }
        }
        if v.alert_ended {
            open = None;
        }
        if s.fit_due() {
            let data = s.take_training();
            match Baseline::fit(&data, &params.baseline, fingerprint.clone()) {
                Ok(b) => {
                    fits.push(json!({
                        "row": i,
                        "modelled_before": modelled,
                        "samples": b.samples,
                        "oof_mape_pct": b.oof_accuracy.mape_pct,
                        "ucl": b.ucl.limit,
                    }));
                    s.install(b);
                }
                Err(e) => {
                    s.fit_failed();
                    fits.push(json!({"row": i, "error": e.to_string()}));
                }
            }
        }
    }
    let doc = json!({
        "rows": rows.len(),
        "modelled": modelled,
        "flagged": flagged,
        "unseen_batch": unseen,
        "fits": fits,
        "alerts": alerts,
    });
    println!("{}", serde_json::to_string_pretty(&doc)?);
    Ok(())
}
