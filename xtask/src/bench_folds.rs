//! `cargo xtask bench --only sentinel` (part): the baseline on LatencyPrism's real vLLM
//! iterations (`../shared/datasets/latencyprism/normal_vllm.csv`, outside the repository),
//! 5-fold cross-validation grouped by job: the jobs are shuffled by a seeded hash and dealt
//! into 5 folds, each held out once. Every row stays in the evaluation, with the tokens
//! `parse_csv` reconstructs for each step from its job's next row (`model::steps`); beside
//! MAPE each fold reports the median error, the share of the summed error carried by the
//! worst 1 % of rows, and the rows that last under 5 % of their job's median step (steps
//! that computed nothing: LatencyPrism's single-request jobs log one such step, ~0.2-1 ms,
//! each time the request finishes before the engine goes idle; the baseline predicts them
//! at their training median, and stallscope's vLLM profile never counts them, since it
//! counts a step only when the model runs).

use std::collections::HashMap;

use anyhow::Result;
use model::{dataset::parse_csv, Baseline, BaselineParams, Fingerprint, Sample};

/// Folds, and the seeds the jobs are dealt with.
const FOLDS: usize = 5;
const SEEDS: [u64; 3] = [1, 2, 3];

/// A stable hash of (seed, job) to deal jobs into folds.
fn deal(seed: u64, job: &str) -> u64 {
    // FNV-1a over the seed's bytes, then the name.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.to_le_bytes().iter().chain(job.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub fn run() -> Result<()> {
    let path = crate::root().join("../shared/datasets/latencyprism/normal_vllm.csv");
    let Ok(text) = std::fs::read_to_string(&path) else {
        println!(
            "\n(LatencyPrism folds skipped: {} is not readable)",
            path.display()
        );
        return Ok(());
    };
    let rows = parse_csv(&text, true)?;
    let mut durations: HashMap<&str, Vec<f64>> = HashMap::new();
    for r in &rows {
        durations
            .entry(r.job.as_str())
            .or_default()
            .push(r.duration_us.unwrap_or(0.0));
    }
    let medians: HashMap<&str, f64> = durations
        .into_iter()
        .map(|(j, mut d)| {
            d.sort_by(f64::total_cmp);
            (j, d[d.len() / 2])
        })
        .collect();
    println!("\n## Baseline on LatencyPrism's vLLM data, 5-fold grouped by job\n");
    println!("| seed | fold | jobs | rows | MAPE % | median APE % | within 10 % | worst 1 % of rows: share of summed error | empty steps (their share of summed error) | MAPE % without them |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for seed in SEEDS {
        let mut jobs: Vec<&str> = medians.keys().copied().collect();
        jobs.sort_by_key(|j| deal(seed, j));
        let fold_of: HashMap<&str, usize> = jobs
            .iter()
            .enumerate()
            .map(|(i, j)| (*j, i % FOLDS))
            .collect();
        let (mut mapes, mut within, mut without) = (Vec::new(), Vec::new(), Vec::new());
        for fold in 0..FOLDS {
            let sample = |r: &model::dataset::Row| Sample {
                workload: r.workload,
                duration_us: r.duration_us.unwrap_or(0.0),
            };
            let train: Vec<Sample> = rows
                .iter()
                .filter(|r| fold_of[r.job.as_str()] != fold)
                .map(sample)
                .collect();
            let test: Vec<&model::dataset::Row> = rows
                .iter()
                .filter(|r| fold_of[r.job.as_str()] == fold)
                .collect();
            let b = Baseline::fit(
                &train,
                &BaselineParams::default(),
                Fingerprint {
                    framework: "vllm".into(),
                    model: "latencyprism".into(),
                    hardware: "A100".into(),
                },
            )?;
            // (APE, empty step?) per held-out row.
            let mut ape: Vec<(f64, bool)> = test
                .iter()
                .map(|r| {
                    let a = r.duration_us.unwrap_or(0.0);
                    let p = b.predict(&r.workload);
                    (((a - p) / a).abs(), a < 0.05 * medians[r.job.as_str()])
                })
                .collect();
            let n = ape.len() as f64;
            let total: f64 = ape.iter().map(|x| x.0).sum();
            let mape = 100.0 * total / n;
            let w10 = 100.0 * ape.iter().filter(|x| x.0 <= 0.10).count() as f64 / n;
            ape.sort_by(|a, b| a.0.total_cmp(&b.0));
            let median = 100.0 * ape[ape.len() / 2].0;
            let top = ape.len().div_ceil(100);
            let top_share: f64 = ape.iter().rev().take(top).map(|x| x.0).sum::<f64>() / total;
            let empty: Vec<f64> = ape.iter().filter(|x| x.1).map(|x| x.0).collect();
            let rest: Vec<f64> = ape.iter().filter(|x| !x.1).map(|x| x.0).collect();
            let njobs = jobs.iter().filter(|j| fold_of[**j] == fold).count();
            println!(
                "| {seed} | {fold} | {njobs} | {} | {mape:.2} | {median:.2} | {w10:.1} | {:.0} % | {} ({:.0} %) | {:.2} |",
                ape.len(),
                100.0 * top_share,
                empty.len(),
                (100.0 * empty.iter().sum::<f64>() / total).abs(),
                100.0 * rest.iter().sum::<f64>() / rest.len() as f64
            );
            mapes.push(mape);
            within.push(w10);
            without.push(100.0 * rest.iter().sum::<f64>() / rest.len() as f64);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len() as f64;
        let worst = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        println!(
            "| {seed} | mean | | | {:.2} (worst {:.2}) | | {:.1} | | | {:.2} (worst {:.2}) |",
            mean(&mapes),
            worst(&mapes),
            mean(&within),
            mean(&without),
            worst(&without)
        );
    }
    Ok(())
}
