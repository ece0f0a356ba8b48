//! `stallscope evaluate --rescore DIR`: an earlier run's tables scored again by this build
//! from what the run wrote (trials.csv, scores.json, state/iterations.csv and
//! state/evaluate.toml), without injecting anything: after a change to the scoring, with
//! another `--grace-steps`, or with the trials' intervals edited in trials.csv. Each trial's
//! deep dive, where trials.csv names it and its report is in state/deep-dives/, is ranked
//! again from the report's suspects and telemetry shifts: its root cause is this build's.

use std::{path::Path, time::Duration};

use anyhow::{bail, Context, Result};
use model::root_cause::{SeriesShift, Suspect};
use serde_json::Value;

use crate::deep_dive::analysis::verdict;

use super::{
    report::{read_iterations, write_outputs, Run},
    slowdown::Slowdown,
    EvaluateArgs, TrialRecord,
};

/// Rewrites `dir`'s trials.csv, scores.json, table.md and heatmap.png.
pub fn run(args: &EvaluateArgs, dir: &Path) -> Result<()> {
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name)).with_context(|| {
            format!(
                "cannot read {}: --rescore takes the --out directory of an earlier evaluation",
                dir.join(name).display()
            )
        })
    };
    let scores: Value = serde_json::from_str(&read("scores.json")?)
        .context("scores.json is not the JSON an evaluation writes")?;
    let mut records = trials(&read("trials.csv")?)?;
    let dives = dir.join("state/deep-dives");
    for r in &mut records {
        if let Some(cause) = r
            .deep_dive
            .map(|id| rerank(&dives, id))
            .transpose()?
            .flatten()
        {
            r.root_cause = Some(cause);
        }
    }
    let mut names: Vec<&str> = Vec::new();
    for r in &records {
        if !names.contains(&r.scenario.as_str()) {
            names.push(&r.scenario);
        }
    }
    let scenarios = names
        .iter()
        .map(|n| anomaly_suite::scenario(n))
        .collect::<Result<Vec<_>>>()?;
    let detector = crate::config::Config::parse(&read("state/evaluate.toml")?, "evaluation")?
        .sentinel
        .params()
        .detector;
    let number = |key: &str| {
        scores[key]
            .as_f64()
            .with_context(|| format!("scores.json has no {key}"))
    };
    let pair = |key: &str| -> Result<(f64, f64)> {
        match scores[key]
            .as_array()
            .map(|a| (a[0].as_f64(), a[1].as_f64()))
        {
            Some((Some(a), Some(b))) => Ok((a, b)),
            _ => bail!("scores.json has no {key} pair"),
        }
    };
    let run = Run {
        ucl: number("ucl")?,
        step: Duration::from_secs_f64(number("engine_step_ms")? / 1e3),
        detector,
    };
    let args = EvaluateArgs {
        scenarios: names.join(","),
        trials: number("trials_per_scenario")? as usize,
        seed: number("seed")? as u64,
        out: dir.to_path_buf(),
        deep_dives: records.iter().any(|r| r.root_cause.is_some()),
        span_steps: pair("span_steps")?,
        lead_steps: pair("lead_steps")?,
        intensity: pair("intensity")?,
        ..args.clone()
    };
    let stream = read_iterations(&dir.join("state/iterations.csv"))?;
    write_outputs(dir, &scenarios, &records, &stream, &run, &args)
}

/// What deep dive `id` names when its saved report (`ID-PID.json` in `dives`) is ranked
/// again; None when the report is not there.
fn rerank(dives: &Path, id: u64) -> Result<Option<String>> {
    #[derive(serde::Deserialize)]
    struct Saved {
        suspects: Vec<Suspect>,
        telemetry: Vec<SeriesShift>,
    }
    let prefix = format!("{id}-");
    let Some(path) = std::fs::read_dir(dives)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        })
    else {
        return Ok(None);
    };
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let mut saved: Saved = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a deep dive's report", path.display()))?;
    model::root_cause::order(&mut saved.suspects);
    Ok(Some(
        verdict(&saved.suspects, &saved.telemetry).unwrap_or_else(|| "none".into()),
    ))
}

/// The records of trials.csv. Every column but the last (the mechanism, quoted) is free of
/// commas; setup_ms is absent from runs before it was recorded.
fn trials(text: &str) -> Result<Vec<TrialRecord>> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .context("trials.csv is empty")?
        .split(',')
        .collect();
    let at = |name: &str| header.iter().position(|h| *h == name);
    let need = |name: &str| at(name).with_context(|| format!("trials.csv has no {name} column"));
    let (scenario, trial, intensity) = (need("scenario")?, need("trial")?, need("intensity")?);
    let (from, inject_from, inject_to, to) = (
        need("from_us")?,
        need("inject_from_us")?,
        need("inject_to_us")?,
        need("to_us")?,
    );
    let (step, elapsed, cause) = (
        need("slowdown_step")?,
        need("slowdown_elapsed")?,
        need("root_cause")?,
    );
    let (setup, dive, mechanism) = (at("setup_ms"), at("deep_dive"), need("mechanism")?);
    lines
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.splitn(header.len(), ',').collect();
            let bad = || format!("trials.csv line {}: {line:?}", i + 2);
            let field = |c: usize| f.get(c).copied().with_context(bad);
            let num = |c: usize| -> Result<f64> { field(c)?.parse().with_context(bad) };
            let opt = |c: usize| optional::<f64>(field(c)?).with_context(bad);
            Ok(TrialRecord {
                scenario: field(scenario)?.to_string(),
                trial: field(trial)?.parse().with_context(bad)?,
                intensity: num(intensity)?,
                from_us: num(from)?,
                inject_from_us: num(inject_from)?,
                inject_to_us: num(inject_to)?,
                to_us: num(to)?,
                setup_ms: setup.map(opt).transpose()?.flatten(),
                deep_dive: dive
                    .map(|c| optional::<u64>(field(c)?).with_context(bad))
                    .transpose()?
                    .flatten(),
                mechanism: field(mechanism)?.trim_matches('"').to_string(),
                root_cause: Some(field(cause)?)
                    .filter(|c| !c.is_empty())
                    .map(str::to_string),
                slowdown: opt(step)?.map(|step| Slowdown {
                    step,
                    elapsed: opt(elapsed).ok().flatten(),
                }),
            })
        })
        .collect()
}

/// An optional CSV field: None when empty.
fn optional<T: std::str::FromStr>(v: &str) -> Result<Option<T>, T::Err> {
    (!v.is_empty()).then(|| v.parse()).transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trials_csv_reads_back_with_and_without_setup() {
        let with = "scenario,trial,intensity,from_us,inject_from_us,inject_to_us,to_us,slowdown_step,slowdown_elapsed,root_cause,setup_ms,mechanism\n\
            cpu-contention,3,0.129,10,20,30,40,1.184,,CPU contention,12.500,\"1 loops, on CPUs [0]\"\n\
            process-pause,0,0.605,50,60,70,80,,,,,\"9 pauses\"\n";
        let r = trials(with).unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].trial, 3);
        assert_eq!(r[0].setup_ms, Some(12.5));
        assert_eq!(r[0].mechanism, "1 loops, on CPUs [0]");
        assert_eq!(r[0].root_cause.as_deref(), Some("CPU contention"));
        assert_eq!(r[0].slowdown.unwrap().step, 1.184);
        assert_eq!(r[0].slowdown.unwrap().elapsed, None);
        assert!(r[1].slowdown.is_none() && r[1].root_cause.is_none());
        let without = "scenario,trial,intensity,from_us,inject_from_us,inject_to_us,to_us,slowdown_step,slowdown_elapsed,root_cause,mechanism\n\
            cpu-contention,0,0.824,1,2,3,4,7.817,6.164,CPU contention,\"x\"\n";
        let r = trials(without).unwrap();
        assert_eq!((r[0].setup_ms, r[0].inject_to_us), (None, 3.0));
        let e = trials("scenario,trial\ncpu,0\n").unwrap_err();
        assert!(format!("{e:#}").contains("no intensity column"), "{e:#}");
        let e = trials(&with.replace("0.129", "x")).unwrap_err();
        assert!(format!("{e:#}").contains("line 2"), "{e:#}");
        let dived = with
            .replace("root_cause,setup_ms", "root_cause,deep_dive,setup_ms")
            .replace("CPU contention,12.500", "CPU contention,7,12.500")
            .replace(",,,,,\"9 pauses", ",,,,,,\"9 pauses");
        let r = trials(&dived).unwrap();
        assert_eq!((r[0].deep_dive, r[1].deep_dive), (Some(7), None));
        assert_eq!(r[0].setup_ms, Some(12.5));
    }

    /// A report saved by a build that ranked by |Z_mu|: the engine thread running longer
    /// while CPU pressure fell came first; ranked again, the worker's blocked time under
    /// reclaim does, and the disk was not saturated (PSI io `full` did not rise).
    #[test]
    fn a_saved_deep_dive_is_ranked_again() {
        let dir = std::env::temp_dir().join(format!("stallscope-rerank-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let suspect = |name: &str, delta: f64, z_beta: f64, z_mu: f64, resource: &str| {
            serde_json::json!({"name": name, "kind": "thread_state", "score": delta * (z_beta + z_mu.abs()),
                "delta_beta": delta, "z_beta": z_beta, "z_mu": z_mu, "resource": resource,
                "normal_beta": 0.0, "anomalous_beta": delta})
        };
        let shift = |name: &str, z: f64| serde_json::json!({"name": name, "normal_mean": 0.0, "anomalous_mean": 1.0, "z": z});
        let report = serde_json::json!({
            "category": null,
            "suspects": [
                suspect("running VLLM::EngineCore", 0.130, 1.4, -3.5, "psi.cpu.some"),
                suspect("blocked (D) VLLM::Worker", 0.027, 2.7, 5.6, "psi.memory.some"),
            ],
            "telemetry": [shift("psi.memory.some", 5.6), shift("psi.io.full", 2.3), shift("psi.io.some", 0.3), shift("mem.used", -0.1)],
        });
        std::fs::write(dir.join("7-123.json"), report.to_string()).unwrap();
        assert_eq!(rerank(&dir, 7).unwrap().as_deref(), Some("memory pressure"));
        assert_eq!(rerank(&dir, 8).unwrap(), None);
        std::fs::write(dir.join("9-123.json"), "{}").unwrap();
        assert!(rerank(&dir, 9).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
