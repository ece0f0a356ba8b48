//! `stallscope evaluate --rescore DIR`: an earlier run's tables scored again by this build
//! from what the run wrote (trials.csv, scores.json, state/iterations.csv and
//! state/evaluate.toml), without injecting anything: after a change to the scoring, with
//! another `--grace-steps`, or with the trials' intervals edited in trials.csv.

use std::{path::Path, time::Duration};

use anyhow::{bail, Context, Result};
use serde_json::Value;

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
    let records = trials(&read("trials.csv")?)?;
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
    let (setup, mechanism) = (at("setup_ms"), need("mechanism")?);
    lines
        .enumerate()
        .map(|(i, line)| {
            let f: Vec<&str> = line.splitn(header.len(), ',').collect();
            let bad = || format!("trials.csv line {}: {line:?}", i + 2);
            let field = |c: usize| f.get(c).copied().with_context(bad);
            let num = |c: usize| -> Result<f64> { field(c)?.parse().with_context(bad) };
            let opt = |c: usize| -> Result<Option<f64>> {
                let v = field(c)?;
                if v.is_empty() {
                    Ok(None)
                } else {
                    v.parse().map(Some).with_context(bad)
                }
            };
            Ok(TrialRecord {
                scenario: field(scenario)?.to_string(),
                trial: field(trial)?.parse().with_context(bad)?,
                intensity: num(intensity)?,
                from_us: num(from)?,
                inject_from_us: num(inject_from)?,
                inject_to_us: num(inject_to)?,
                to_us: num(to)?,
                setup_ms: setup.map(opt).transpose()?.flatten(),
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
    }
}
