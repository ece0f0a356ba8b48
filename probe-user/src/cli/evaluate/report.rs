//! What `stallscope evaluate` writes: the scores of every strategy per scenario from the
//! daemon's iteration export and the trials' intervals (trials.csv, scores.json, table.md and
//! heatmap.png). Scores come three ways: every iteration labelled (LatencyPrism's way), with a
//! recovery grace after each injection, and, with the grace, over the trials whose injection
//! slowed the engine by its own clock by at least [`GOAL_SLOWDOWN`]; recall is also given by
//! the engine's measured slowdown, and each scenario's slowdown by intensity (calibration).

use std::{fmt::Write as _, path::Path, time::Duration};

use anomaly_suite::score::{self, Iteration, Scores, Strategy, Trial};
use anyhow::{Context, Result};
use model::detector::{Detector, DetectorParams, Span, Step};
use serde_json::{json, Value};

use super::{heatmap::Heatmap, slowdown::median, EvaluateArgs, TrialRecord};

/// Fixed-Window threshold of the paper's Table 5.
const FIXED_THRESHOLD: f64 = 0.15;
/// Moving-mean window of the paper's per-iteration window strategies, iterations.
const WINDOW: usize = 10;
/// Trials whose injection slowed the engine at least this much (its decode period, by its own log)
/// make the goal set.
const GOAL_SLOWDOWN: f64 = 1.2;
/// Classes of the recall-by-slowdown table: [from, to).
const SLOWDOWN_BINS: [(f64, f64); 5] = [
    (0.0, 1.1),
    (1.1, 1.2),
    (1.2, 1.5),
    (1.5, 2.0),
    (2.0, f64::INFINITY),
];
/// Iterations shown before and after each injection start in the heatmap.
const HEAT_BEFORE: usize = 40;
const HEAT_AFTER: usize = 80;

/// Decode iterations with a prediction, from the daemon's iteration export.
pub fn read_iterations(path: &Path) -> Result<Vec<Iteration>> {
    read_export(
        path,
        ["start_ts", "duration_us", "stage", "predicted_us"],
        |[start, dur, stage, pred]| {
            (stage == "decode").then_some(())?;
            Some(Iteration {
                start_us: start.parse().ok()?,
                duration_us: dur.parse().ok()?,
                predicted_us: pred.parse().ok()?,
            })
        },
    )
}

/// The rows of the daemon's iteration export that `row` makes something of, from the fields
/// of the `N` named columns in that order.
pub fn read_export<const N: usize, T>(
    path: &Path,
    columns: [&str; N],
    row: impl Fn([&str; N]) -> Option<T>,
) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read the iteration export {}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .context("an empty export")?
        .split(',')
        .collect();
    let mut at = [0; N];
    for (i, name) in columns.iter().enumerate() {
        at[i] = header
            .iter()
            .position(|h| h == name)
            .with_context(|| format!("no {name} column in {}", path.display()))?;
    }
    Ok(lines
        .filter_map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            let mut fields = [""; N];
            for (field, &i) in fields.iter_mut().zip(&at) {
                *field = f.get(i)?;
            }
            row(fields)
        })
        .collect())
}

/// What the evaluation's run fixed, for the tables.
pub struct Run {
    /// The fitted model's UCL.
    pub ucl: f64,
    /// The engine's decode step when the trials started.
    pub step: Duration,
    /// The daemon's alert rule.
    pub detector: DetectorParams,
}

fn span_text(s: Span) -> String {
    match s {
        Span::Iterations(n) => format!("{n} it"),
        Span::Micros(us) => format!("{} ms", us / 1000),
    }
}

/// Whether the daemon's alert rule has an alert open after each iteration of `stream`: the
/// live detector replayed over the export (one model, so one UCL, as the evaluation runs).
fn sentinel_flags(stream: &[Iteration], ucl: f64, params: DetectorParams) -> Vec<bool> {
    let mut d = Detector::new(params);
    stream
        .iter()
        .map(|it| {
            let step = Step {
                end_ns: (it.end_us() * 1e3) as u64,
                observed_us: it.duration_us,
                predicted_us: it.predicted_us,
                error: it.error(),
            };
            d.push(step, ucl);
            d.active()
        })
        .collect()
}

/// Every strategy scored, in table order: the daemon's rule first, then the paper's.
fn flag_sets(stream: &[Iteration], run: &Run) -> Vec<(String, Vec<bool>)> {
    let d = run.detector;
    let mut sets = vec![(
        format!(
            "Sentinel (W {}, after {})",
            span_text(d.window),
            span_text(d.start_after)
        ),
        sentinel_flags(stream, run.ucl, d),
    )];
    for strategy in [
        Strategy::DynamicPoint,
        Strategy::DynamicWindow,
        Strategy::FixedWindow(FIXED_THRESHOLD),
    ] {
        sets.push((
            strategy.name(),
            score::flags(stream, strategy, run.ucl, WINDOW),
        ));
    }
    sets
}

/// The trial a record scores, with or without the recovery grace.
fn trial(r: &TrialRecord, grace_us: f64) -> Trial {
    Trial {
        from_us: r.from_us,
        to_us: r.to_us,
        inject_from_us: r.inject_from_us,
        inject_to_us: r.inject_to_us,
        grace_to_us: r.inject_to_us + grace_us,
    }
}

/// One way of scoring: which trials, and the grace.
struct Set {
    key: &'static str,
    title: String,
    grace_us: f64,
    keep: fn(&TrialRecord) -> bool,
}

/// Per strategy, per scenario and overall.
type Table = Vec<(String, Vec<(String, Scores)>)>;

fn table(
    stream: &[Iteration],
    flags: &[(String, Vec<bool>)],
    scenarios: &[&anomaly_suite::Scenario],
    records: &[TrialRecord],
    set: &Set,
) -> Table {
    flags
        .iter()
        .map(|(name, f)| {
            let rows = scenarios
                .iter()
                .map(|s| Some(s.name))
                .chain([None])
                .map(|scenario| {
                    let trials: Vec<Trial> = records
                        .iter()
                        .filter(|r| scenario.is_none_or(|n| r.scenario == n) && (set.keep)(r))
                        .map(|r| trial(r, set.grace_us))
                        .collect();
                    (
                        scenario.unwrap_or("overall").to_string(),
                        score::score(stream, f, &trials),
                    )
                })
                .collect();
            (name.clone(), rows)
        })
        .collect()
}

fn slowed(r: &TrialRecord) -> bool {
    r.slowdown.is_some_and(|s| s.step >= GOAL_SLOWDOWN)
}

fn bin_name((from, to): (f64, f64)) -> String {
    if to.is_infinite() {
        format!(">= {from:.1}x")
    } else if from == 0.0 {
        format!("< {to:.1}x")
    } else {
        format!("{from:.1}-{to:.1}x")
    }
}

/// Per strategy and slowdown class: trials, trials detected and iteration recall (with the
/// grace); unmeasured trials apart.
fn recall_by_slowdown(
    stream: &[Iteration],
    flags: &[(String, Vec<bool>)],
    records: &[TrialRecord],
    grace_us: f64,
) -> Vec<Value> {
    // A class is a slowdown range, or None for the trials not measured.
    let classes: Vec<Option<(f64, f64)>> = SLOWDOWN_BINS
        .iter()
        .copied()
        .map(Some)
        .chain([None])
        .collect();
    let in_class = |r: &TrialRecord, c: Option<(f64, f64)>| match (c, r.slowdown) {
        (Some((from, to)), Some(s)) => s.step >= from && s.step < to,
        (None, None) => true,
        _ => false,
    };
    flags
        .iter()
        .map(|(name, f)| {
            let rows: Vec<Value> = classes
                .iter()
                .map(|&class| {
                    let trials: Vec<Trial> = records
                        .iter()
                        .filter(|r| in_class(r, class))
                        .map(|r| trial(r, grace_us))
                        .collect();
                    let s = score::score(stream, f, &trials);
                    json!({"slowdown": class.map_or("not measured".into(), bin_name), "trials": s.trials, "detected": s.detected, "recall": s.recall})
                })
                .collect();
            json!({"strategy": name, "classes": rows})
        })
        .collect()
}

/// Per scenario: the engine's slowdown at each third of the intensity range, and what the
/// scenario can do to this engine.
fn calibration(
    scenarios: &[&anomaly_suite::Scenario],
    records: &[TrialRecord],
    range: (f64, f64),
) -> Vec<Value> {
    let third = (range.1 - range.0) / 3.0;
    scenarios
        .iter()
        .map(|s| {
            let of: Vec<&TrialRecord> = records.iter().filter(|r| r.scenario == s.name).collect();
            let bins: Vec<Value> = (0..3)
                .map(|i| {
                    let lo = range.0 + third * i as f64;
                    let hi = if i == 2 { f64::INFINITY } else { lo + third };
                    let rates: Vec<f64> = of
                        .iter()
                        .filter(|r| r.intensity >= lo && r.intensity < hi)
                        .filter_map(|r| r.slowdown.map(|x| x.step))
                        .collect();
                    json!({"intensity": [lo, (lo + third).min(range.1)], "trials": rates.len(), "median_slowdown": median(rates)})
                })
                .collect();
            let rates: Vec<f64> = of.iter().filter_map(|r| r.slowdown.map(|x| x.step)).collect();
            let max = rates.iter().copied().fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            let reach = match max {
                None => "not measured",
                Some(m) if m >= 2.0 => "severe (>= 2x) reached",
                Some(m) if m >= 1.2 => "mild (1.2-2x) at most",
                Some(_) => "does not slow this engine (< 1.2x at every intensity)",
            };
            json!({"scenario": s.name, "intensity_means": s.intensity, "bins": bins, "max_slowdown": max, "reach": reach})
        })
        .collect()
}

pub fn write_outputs(
    out: &Path,
    scenarios: &[&anomaly_suite::Scenario],
    records: &[TrialRecord],
    stream: &[Iteration],
    run: &Run,
    args: &EvaluateArgs,
) -> Result<()> {
    let flags = flag_sets(stream, run);
    let grace_us = run.step.as_secs_f64() * 1e6 * args.grace_steps;
    let sets = [
        Set {
            key: "all_iterations",
            title: "Every iteration labelled (LatencyPrism's scoring)".into(),
            grace_us: 0.0,
            keep: |_| true,
        },
        Set {
            key: "with_grace",
            title: format!(
                "With a recovery grace of {:.0} steps ({:.2} s) after each injection",
                args.grace_steps,
                grace_us / 1e6
            ),
            grace_us,
            keep: |_| true,
        },
        Set {
            key: "slowed_trials_with_grace",
            title: format!(
                "Trials whose injection slowed the engine >= {GOAL_SLOWDOWN}x by its own log, with the grace"
            ),
            grace_us,
            keep: slowed,
        },
    ];
    let tables: Vec<(&Set, Table)> = sets
        .iter()
        .map(|set| (set, table(stream, &flags, scenarios, records, set)))
        .collect();
    let by_slowdown = recall_by_slowdown(stream, &flags, records, grace_us);
    let calibration = calibration(scenarios, records, args.intensity);
    // trials.csv
    let mut csv = String::from(
        "scenario,trial,intensity,from_us,inject_from_us,inject_to_us,to_us,slowdown_step,slowdown_elapsed,root_cause,deep_dive,setup_ms,mechanism\n",
    );
    // Full precision (the shortest form that reads back the same): `--rescore` reads it.
    let opt = |v: Option<f64>| v.map_or(String::new(), |v| v.to_string());
    for r in records {
        let _ = writeln!(
            csv,
            "{},{},{:.3},{:.0},{:.0},{:.0},{:.0},{},{},{},{},{},\"{}\"",
            r.scenario,
            r.trial,
            r.intensity,
            r.from_us,
            r.inject_from_us,
            r.inject_to_us,
            r.to_us,
            opt(r.slowdown.map(|s| s.step)),
            opt(r.slowdown.and_then(|s| s.elapsed)),
            r.root_cause.as_deref().unwrap_or(""),
            r.deep_dive.map_or(String::new(), |id| id.to_string()),
            opt(r.setup_ms),
            r.mechanism.replace('"', "'")
        );
    }
    std::fs::write(out.join("trials.csv"), csv)?;
    // root cause top-1
    let root_causes: Vec<Value> = scenarios
        .iter()
        .filter(|_| args.deep_dives)
        .map(|s| {
            let trials = || records.iter().filter(|r| r.scenario == s.name);
            let got: Vec<&str> = trials().filter_map(|r| r.root_cause.as_deref()).collect();
            // The goal's count: the deep dives of trials that slowed the engine.
            let slowed_got: Vec<&str> = trials()
                .filter(|r| slowed(r))
                .filter_map(|r| r.root_cause.as_deref())
                .collect();
            let correct = |got: &[&str]| s.cause.map(|c| got.iter().filter(|g| **g == c).count());
            json!({
                "scenario": s.name,
                "expected": s.cause,
                "deep_dives": got.len(),
                "correct": correct(&got),
                "slowed_deep_dives": slowed_got.len(),
                "slowed_correct": correct(&slowed_got),
                "categories": got,
            })
        })
        .collect();
    let tables_json: serde_json::Map<String, Value> = tables
        .iter()
        .map(|(set, t)| {
            let strategies: serde_json::Map<String, Value> = t
                .iter()
                .map(|(name, rows)| {
                    let rows: serde_json::Map<String, Value> = rows
                        .iter()
                        .map(|(n, s)| (n.clone(), serde_json::to_value(s).unwrap_or_default()))
                        .collect();
                    (name.clone(), Value::Object(rows))
                })
                .collect();
            (set.key.to_string(), Value::Object(strategies))
        })
        .collect();
    let scores = json!({
        "ucl": run.ucl,
        "window": WINDOW,
        "sentinel_rule": run.detector,
        "seed": args.seed,
        "trials_per_scenario": args.trials,
        "engine_step_ms": run.step.as_secs_f64() * 1e3,
        "span_steps": [args.span_steps.0, args.span_steps.1],
        "lead_steps": [args.lead_steps.0, args.lead_steps.1],
        "intensity": [args.intensity.0, args.intensity.1],
        "grace_steps": args.grace_steps,
        "goal_slowdown": GOAL_SLOWDOWN,
        "decode_iterations": stream.len(),
        "scores": tables_json,
        "recall_by_slowdown": by_slowdown,
        "calibration": calibration,
        "root_cause_top1": root_causes,
    });
    std::fs::write(
        out.join("scores.json"),
        serde_json::to_string_pretty(&scores)?,
    )?;
    std::fs::write(
        out.join("table.md"),
        markdown(
            &tables,
            &by_slowdown,
            &calibration,
            run,
            args,
            records,
            &root_causes,
        ),
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
    heat.write_png(&out.join("heatmap.png"), run.ucl)?;
    print!("{}", std::fs::read_to_string(out.join("table.md"))?);
    Ok(())
}

fn pct(v: f64) -> String {
    format!("{:.1}", 100.0 * v)
}

fn markdown(
    tables: &[(&Set, Table)],
    by_slowdown: &[Value],
    calibration: &[Value],
    run: &Run,
    args: &EvaluateArgs,
    records: &[TrialRecord],
    root_causes: &[Value],
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Detection on vLLM ({} trials per scenario, seed {}, UCL {:.3}, step {:.1} ms)\n",
        args.trials,
        args.seed,
        run.ucl,
        run.step.as_secs_f64() * 1e3
    );
    let _ = writeln!(s, "Per decode iteration; an iteration is abnormal when it overlaps its trial's injection. Sentinel: the daemon's alert rule (moving mean over W in time, persistence, hysteresis); the paper's window strategies use W = {WINDOW} iterations. Lag: abnormal iterations (and ms from the injection start) before the first flagged one, over detected trials. Injections of {:.0}-{:.0} steps at intensity {}-{}; slowdown: the engine's decode period (time outside prefills per decode step) in the injection over that in the lead, from vLLM's own log.\n", args.span_steps.0, args.span_steps.1, args.intensity.0, args.intensity.1);
    for (set, t) in tables {
        let _ = writeln!(s, "## {}\n", set.title);
        let _ = writeln!(s, "| Strategy | Scenario | Precision % | Recall % | F1 % | FPR % | Detected | Lag (it) | Lag (ms) |");
        let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
        for (strategy, rows) in t {
            for (name, x) in rows.iter().filter(|(_, x)| x.trials > 0) {
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
        let _ = writeln!(s);
    }
    let _ = writeln!(s, "## Recall by the engine's slowdown (with the grace)\n");
    let _ = writeln!(s, "| Strategy | Slowdown | Trials | Detected | Recall % |");
    let _ = writeln!(s, "|---|---|---:|---:|---:|");
    for st in by_slowdown {
        for c in st["classes"].as_array().into_iter().flatten() {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                st["strategy"].as_str().unwrap_or(""),
                c["slowdown"].as_str().unwrap_or(""),
                c["trials"],
                c["detected"],
                pct(c["recall"].as_f64().unwrap_or(0.0))
            );
        }
    }
    let _ = writeln!(s, "\n## Calibration: the engine's slowdown by intensity\n");
    let _ = writeln!(s, "| Scenario | Intensity means | Median slowdown per third of the range (trials) | Max | Reach |");
    let _ = writeln!(s, "|---|---|---|---:|---|");
    for c in calibration {
        let bins: Vec<String> = c["bins"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|b| {
                format!(
                    "{:.2}-{:.2}: {} ({})",
                    b["intensity"][0].as_f64().unwrap_or(0.0),
                    b["intensity"][1].as_f64().unwrap_or(0.0),
                    b["median_slowdown"]
                        .as_f64()
                        .map_or("-".into(), |v| format!("{v:.2}x")),
                    b["trials"]
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} |",
            c["scenario"].as_str().unwrap_or(""),
            c["intensity_means"].as_str().unwrap_or(""),
            bins.join("; "),
            c["max_slowdown"]
                .as_f64()
                .map_or("-".into(), |v| format!("{v:.2}x")),
            c["reach"].as_str().unwrap_or("")
        );
    }
    if !root_causes.is_empty() {
        let _ = writeln!(
            s,
            "\n## Root cause top-1 (deep dive during each injection)\n"
        );
        let _ = writeln!(
            s,
            "| Scenario | Expected | Correct | Correct when >= {GOAL_SLOWDOWN}x slower | Categories |"
        );
        let _ = writeln!(s, "|---|---|---:|---:|---|");
        let of = |r: &Value, correct: &str, of: &str| {
            r[correct]
                .as_u64()
                .map_or("-".into(), |c| format!("{c}/{}", r[of]))
        };
        for r in root_causes {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r["scenario"].as_str().unwrap_or(""),
                r["expected"].as_str().unwrap_or("-"),
                of(r, "correct", "deep_dives"),
                of(r, "slowed_correct", "slowed_deep_dives"),
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
    let _ = writeln!(
        s,
        "\n## Mechanisms (first trial of each scenario)\n\nEach injection is labelled from the moment its stress took hold; the setup before it (waiting for the engine's safe point, making a cgroup) acts on nothing yet and is scored as normal, as the lead before it.\n"
    );
    let mut seen = std::collections::BTreeSet::new();
    for r in records {
        if seen.insert(&r.scenario) {
            let setup: Vec<f64> = records
                .iter()
                .filter(|o| o.scenario == r.scenario)
                .filter_map(|o| o.setup_ms)
                .collect();
            let max = setup.iter().copied().fold(f64::NAN, f64::max);
            let setup = median(setup).map_or(String::new(), |m| {
                format!(" (setup: median {m:.0} ms, at most {max:.0} ms)")
            });
            let _ = writeln!(s, "- {}: {}{setup}", r.scenario, r.mechanism);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::evaluate::slowdown::Slowdown;

    /// 1 ms steps; iterations in `slow` take twice their prediction.
    fn stream(slow: std::ops::Range<usize>) -> Vec<Iteration> {
        (0..400)
            .map(|i| Iteration {
                start_us: i as f64 * 1000.0,
                duration_us: if slow.contains(&i) { 1000.0 } else { 500.0 },
                predicted_us: 500.0,
            })
            .collect()
    }

    fn record(scenario: &str, slowdown: Option<f64>) -> TrialRecord {
        TrialRecord {
            scenario: scenario.into(),
            trial: 0,
            intensity: 0.5,
            from_us: 0.0,
            inject_from_us: 100_000.0,
            inject_to_us: 200_000.0,
            to_us: 400_000.0,
            setup_ms: None,
            mechanism: String::new(),
            deep_dive: None,
            root_cause: None,
            slowdown: slowdown.map(|step| Slowdown {
                step,
                elapsed: None,
            }),
        }
    }

    #[test]
    fn the_sentinel_rule_alerts_after_its_persistence_and_the_grace_takes_its_tail() {
        let s = stream(100..200);
        let run = Run {
            ucl: 0.2,
            step: Duration::from_millis(1),
            detector: DetectorParams {
                window: Span::Micros(10_000),
                start_after: Span::Micros(5_000),
                ..DetectorParams::default()
            },
        };
        let flags = flag_sets(&s, &run);
        assert!(flags[0].0.starts_with("Sentinel (W 10 ms, after 5 ms)"));
        let r = record("x", Some(2.0));
        let plain = score::score(&s, &flags[0].1, &[trial(&r, 0.0)]);
        // The mean of E (0.5 per slow step) over 10 ms passes 0.2 at the 5th slow step and the
        // alert opens 5 ms later; it closes 10 calm steps after the mean falls back.
        assert_eq!(plain.detected, 1);
        assert!(plain.fp > 0, "the alert outlasts the injection");
        let graced = score::score(&s, &flags[0].1, &[trial(&r, 40_000.0)]);
        assert_eq!((graced.tp, graced.fp), (plain.tp, 0));
    }

    #[test]
    fn goal_set_and_slowdown_classes_follow_the_measured_slowdown() {
        let s = stream(100..200);
        let run = Run {
            ucl: 0.2,
            step: Duration::from_millis(1),
            detector: DetectorParams::default(),
        };
        let flags = flag_sets(&s, &run);
        let records = [
            record("a", Some(1.05)),
            record("a", Some(2.5)),
            record("a", None),
        ];
        let scenario = anomaly_suite::scenario("cpu-contention").unwrap();
        let goal = Set {
            key: "g",
            title: String::new(),
            grace_us: 0.0,
            keep: slowed,
        };
        let t = table(&s, &flags, &[scenario], &records, &goal);
        let overall = &t[0].1.last().unwrap().1;
        assert_eq!(overall.trials, 1, "only the trial slowed 2.5x");
        let by = recall_by_slowdown(&s, &flags, &records, 0.0);
        let classes = by[0]["classes"].as_array().unwrap();
        let trials: Vec<u64> = classes
            .iter()
            .map(|c| c["trials"].as_u64().unwrap())
            .collect();
        assert_eq!(trials, [1, 0, 0, 0, 1, 1]);
        assert_eq!(bin_name(SLOWDOWN_BINS[0]), "< 1.1x");
        assert_eq!(bin_name(SLOWDOWN_BINS[4]), ">= 2.0x");
    }
}
