//! What `stallscope evaluate` writes: the scores of every strategy per scenario from the
//! daemon's iteration export and the trials' intervals (trials.csv, scores.json, table.md and
//! heatmap.png).

use std::{collections::BTreeMap, fmt::Write as _, path::Path};

use anomaly_suite::score::{self, Iteration, Scores, Strategy, Trial};
use anyhow::{Context, Result};
use serde_json::{json, Value};

use super::{heatmap::Heatmap, EvaluateArgs, TrialRecord};

/// Fixed-Window threshold of the paper's Table 5.
const FIXED_THRESHOLD: f64 = 0.15;
/// Moving-mean window (the sentinel's W).
const WINDOW: usize = 10;
/// Iterations shown before and after each injection start in the heatmap.
const HEAT_BEFORE: usize = 40;
const HEAT_AFTER: usize = 80;

/// Decode iterations with a prediction, from the daemon's iteration export.
pub fn read_iterations(path: &Path) -> Result<Vec<Iteration>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the iteration export {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .context("an empty export")?
        .split(',')
        .collect();
    let col = |n: &str| {
        header
            .iter()
            .position(|h| *h == n)
            .with_context(|| format!("no {n} column in {}", path.display()))
    };
    let (start, dur, stage, pred) = (
        col("start_ts")?,
        col("duration_us")?,
        col("stage")?,
        col("predicted_us")?,
    );
    Ok(lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f.get(stage)? == &"decode").then_some(())?;
            Some(Iteration {
                start_us: f.get(start)?.parse().ok()?,
                duration_us: f.get(dur)?.parse().ok()?,
                predicted_us: f.get(pred)?.parse().ok()?,
            })
        })
        .collect())
}

fn strategies() -> [Strategy; 3] {
    [
        Strategy::DynamicPoint,
        Strategy::DynamicWindow,
        Strategy::FixedWindow(FIXED_THRESHOLD),
    ]
}

pub fn write_outputs(
    out: &Path,
    scenarios: &[&anomaly_suite::Scenario],
    records: &[TrialRecord],
    stream: &[Iteration],
    ucl: f64,
    step: std::time::Duration,
    args: &EvaluateArgs,
) -> Result<()> {
    let trials_of = |name: Option<&str>| -> Vec<Trial> {
        records
            .iter()
            .filter(|r| name.is_none_or(|n| r.scenario == n))
            .map(|r| Trial {
                from_us: r.from_us,
                to_us: r.to_us,
                inject_from_us: r.inject_from_us,
                inject_to_us: r.inject_to_us,
            })
            .collect()
    };
    let mut table: BTreeMap<String, Vec<(String, Scores)>> = BTreeMap::new();
    for strategy in strategies() {
        let flags = score::flags(stream, strategy, ucl, WINDOW);
        for name in scenarios.iter().map(|s| Some(s.name)).chain([None]) {
            let s = score::score(stream, &flags, &trials_of(name));
            table
                .entry(strategy.name())
                .or_default()
                .push((name.unwrap_or("overall").to_string(), s));
        }
    }
    // trials.csv
    let mut csv = String::from(
        "scenario,trial,intensity,from_us,inject_from_us,inject_to_us,to_us,root_cause,mechanism\n",
    );
    for r in records {
        let _ = writeln!(
            csv,
            "{},{},{:.3},{:.0},{:.0},{:.0},{:.0},{},\"{}\"",
            r.scenario,
            r.trial,
            r.intensity,
            r.from_us,
            r.inject_from_us,
            r.inject_to_us,
            r.to_us,
            r.root_cause.as_deref().unwrap_or(""),
            r.mechanism.replace('"', "'")
        );
    }
    std::fs::write(out.join("trials.csv"), csv)?;
    // root cause top-1
    let root_causes: Vec<Value> = scenarios
        .iter()
        .filter(|_| args.deep_dives)
        .map(|s| {
            let got: Vec<&str> = records
                .iter()
                .filter(|r| r.scenario == s.name)
                .filter_map(|r| r.root_cause.as_deref())
                .collect();
            let correct = s
                .cause
                .map(|c| got.iter().filter(|g| **g == c).count());
            json!({"scenario": s.name, "expected": s.cause, "deep_dives": got.len(), "correct": correct, "categories": got})
        })
        .collect();
    let scores = json!({
        "ucl": ucl,
        "window": WINDOW,
        "seed": args.seed,
        "trials_per_scenario": args.trials,
        "engine_step_ms": step.as_secs_f64() * 1e3,
        "span_steps": [args.span_steps.0, args.span_steps.1],
        "lead_steps": [args.lead_steps.0, args.lead_steps.1],
        "decode_iterations": stream.len(),
        "strategies": table.iter().map(|(k, v)| (k.clone(), v.iter().map(|(n, s)| (n.clone(), s)).collect::<BTreeMap<_, _>>())).collect::<BTreeMap<_, _>>(),
        "root_cause_top1": root_causes,
    });
    std::fs::write(
        out.join("scores.json"),
        serde_json::to_string_pretty(&scores)?,
    )?;
    std::fs::write(
        out.join("table.md"),
        markdown(&table, ucl, args, records, &root_causes),
    )?;
    let heat = Heatmap::from_trials(
        stream,
        records
            .iter()
            .map(|r| (r.scenario.as_str(), r.inject_from_us)),
        HEAT_BEFORE,
        HEAT_AFTER,
        WINDOW,
    );
    heat.write_png(&out.join("heatmap.png"), ucl)?;
    print!("{}", std::fs::read_to_string(out.join("table.md"))?);
    Ok(())
}

fn pct(v: f64) -> String {
    format!("{:.1}", 100.0 * v)
}

fn markdown(
    table: &BTreeMap<String, Vec<(String, Scores)>>,
    ucl: f64,
    args: &EvaluateArgs,
    records: &[TrialRecord],
    root_causes: &[Value],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Detection on vLLM ({} trials per scenario, seed {}, UCL {ucl:.3}, W = {WINDOW})\n",
        args.trials, args.seed
    );
    let _ = writeln!(s, "Per decode iteration; an iteration is abnormal when it overlaps its trial's injection. Lag: abnormal iterations (and ms from the injection start) before the first flagged one, over detected trials.\n");
    let _ = writeln!(s, "| Strategy | Scenario | Precision % | Recall % | F1 % | FPR % | Detected | Lag (it) | Lag (ms) |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for (strategy, rows) in table {
        for (name, x) in rows {
            let _ = writeln!(
                s,
                "| {strategy} | {name} | {} | {} | {} | {:.2} | {}/{} | {} | {} |",
                pct(x.precision),
                pct(x.recall),
                pct(x.f1),
                100.0 * x.fpr,
                x.detected,
                x.trials,
                x.lag_iterations.map_or("-".into(), |v| format!("{v:.1}")),
                x.lag_ms.map_or("-".into(), |v| format!("{v:.0}")),
            );
        }
    }
    if !root_causes.is_empty() {
        let _ = writeln!(
            s,
            "\n## Root cause top-1 (deep dive during each injection)\n"
        );
        let _ = writeln!(s, "| Scenario | Expected | Correct | Categories |");
        let _ = writeln!(s, "|---|---|---:|---|");
        for r in root_causes {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} |",
                r["scenario"].as_str().unwrap_or(""),
                r["expected"].as_str().unwrap_or("-"),
                r["correct"]
                    .as_u64()
                    .map_or("-".into(), |c| format!("{c}/{}", r["deep_dives"])),
                r["categories"]
                    .as_array()
                    .map(|a| a
                        .iter()
                        .filter_map(Value::as_str)
                        .collect::<Vec<_>>()
                        .join(", "))
                    .unwrap_or_default()
            );
        }
    }
    let _ = writeln!(s, "\n## Mechanisms (first trial of each scenario)\n");
    let mut seen = std::collections::BTreeSet::new();
    for r in records {
        if seen.insert(&r.scenario) {
            let _ = writeln!(s, "- {}: {}", r.scenario, r.mechanism);
        }
    }
    s
}
