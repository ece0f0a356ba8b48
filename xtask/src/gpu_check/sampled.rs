//! What sampled tracing costs (`stallscope gpu --sample`): detached windows interleaved with
//! sampled ones, and the loop's own steps in the sampled windows split by the agent's switches
//! into traced, untraced and just-switched steps, each against the detached steps. From the
//! three, the cost at any sampling follows: duty x traced + (1 - duty) x untraced + the
//! switches' own excess time per period. A 10 % duty's cost (~0.3 %) is below what A/B windows
//! of a few seconds resolve (±2 %), so it is derived, not measured directly.

use std::{path::Path, process::Command, time::Duration};

use anyhow::{bail, Result};
use cupti_sys::sampling::Sampling;
use serde_json::{json, Value};
use sys_util::clock::monotonic_ns;

use super::decode_loop::{median, DecodeLoop};

/// Each detached window.
const DETACHED: Duration = Duration::from_secs(5);
/// Each sampled window.
const SAMPLED: Duration = Duration::from_secs(9);
/// The sampling of the sampled windows: three switches on and off in each.
const SAMPLING: &str = "1s/3s";
/// Steps that begin this soon after a switch are the switch's.
const SWITCH_NS: u64 = 100_000_000;
/// The sampling whose cost is derived (the daemon's default).
const DEFAULT: &str = "1s/10s";

fn mean(v: &[u64]) -> Option<f64> {
    (!v.is_empty()).then(|| v.iter().sum::<u64>() as f64 / v.len() as f64)
}

/// The agent's switches (the traced spans' starts and ends) within `[from, to)`.
fn switch_times(spans: &[(u64, u64)], from: u64, to: u64) -> Vec<u64> {
    spans
        .iter()
        .flat_map(|&(a, b)| [a, b])
        .filter(|t| (from..to).contains(t))
        .collect()
}

/// Steps of `[from, to]` by where they began: traced, untraced, within a switch.
fn split(
    steps: &[(u64, u64)],
    spans: &[(u64, u64)],
    from: u64,
    to: u64,
) -> (Vec<u64>, Vec<u64>, Vec<u64>) {
    let switches = switch_times(spans, from, to);
    let (mut on, mut off, mut switching) = (Vec::new(), Vec::new(), Vec::new());
    for &(s, e) in steps.iter().filter(|(s, e)| from <= *s && *e <= to) {
        if switches.iter().any(|&t| t <= s && s < t + SWITCH_NS) {
            switching.push(e - s);
        } else if spans.iter().any(|&(a, b)| a <= s && e <= b) {
            on.push(e - s);
        } else if !spans.iter().any(|&(a, b)| s < b && a < e) {
            off.push(e - s);
        }
    }
    (on, off, switching)
}

/// Runs `rounds` rounds on the loop.
pub fn run(bin: &Path, target: &mut DecodeLoop, rounds: usize) -> Result<Value> {
    let pid = target.pid;
    let (mut detached, mut on, mut off, mut switching) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut switches, mut per_round, mut alive) = (0usize, Vec::new(), Vec::new());
    let (mut sampled_all, mut traced_ns, mut window_ns) = (Vec::new(), 0u64, 0u64);
    for round in 0..rounds {
        let a = monotonic_ns();
        std::thread::sleep(DETACHED);
        let d = target.steps_between(a, monotonic_ns());
        let out = Command::new(bin)
            .args([
                "gpu",
                "--pid",
                &pid.to_string(),
                "--json",
                "--sample",
                SAMPLING,
            ])
            .arg("--duration")
            .arg(format!("{}s", SAMPLED.as_secs()))
            .output()?;
        if !out.status.success() {
            bail!(
                "stallscope gpu --sample {SAMPLING} failed (round {round}): {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(700));
        let r: Value = serde_json::from_slice(&out.stdout)?;
        let spans: Vec<(u64, u64)> = serde_json::from_value(r["traced_ns"].clone())?;
        let [from, to]: [u64; 2] = serde_json::from_value(r["window_ns"].clone())?;
        let steps = target.step_spans(from, to);
        let (o, f, s) = split(&steps, &spans, from, to);
        switches += switch_times(&spans, from, to).len();
        traced_ns += spans.iter().map(|(a, b)| b - a).sum::<u64>();
        window_ns += to - from;
        let all: Vec<u64> = steps.iter().map(|(s, e)| e - s).collect();
        let cost = |v: &[u64]| mean(&d).zip(mean(v)).map(|(d, v)| 100.0 * (v / d - 1.0));
        per_round.push(json!({
            "traced_pct": cost(&o), "untraced_pct": cost(&f), "whole_window_pct": cost(&all),
            "steps": [d.len(), o.len(), f.len(), s.len()], "spans": spans.len(),
            "lost_events": r["lost_events"], "cupti_dropped": r["cupti_dropped"],
            "agent_unloaded": r["agent_unloaded"],
        }));
        eprintln!("gpu-check: sampled round {round}: {}", per_round[round]);
        detached.extend(d);
        on.extend(o);
        off.extend(f);
        switching.extend(s);
        sampled_all.extend(all);
        alive.push(target.alive());
    }
    let d = mean(&detached).unwrap_or(f64::NAN);
    let cost = |v: &[u64]| mean(v).map(|v| 100.0 * (v / d - 1.0));
    let cost_median = |v: &[u64]| {
        median(v)
            .zip(median(&detached))
            .map(|(v, d)| 100.0 * (v as f64 / d as f64 - 1.0))
    };
    // Time the switches' steps took beyond detached ones, per switch.
    let switch_excess_ns = (switches > 0)
        .then(|| switching.iter().map(|&s| s as f64 - d).sum::<f64>() / switches as f64);
    let default: Sampling = DEFAULT.parse()?;
    let derived = cost(&on).zip(cost(&off)).map(|(c_on, c_off)| {
        let duty = default.duty();
        let period_ns = f64::from(default.every_ms) * 1e6;
        duty * c_on
            + (1.0 - duty) * c_off
            + 100.0 * 2.0 * switch_excess_ns.unwrap_or(0.0) / period_ns
    });
    Ok(json!({
        "sampling": SAMPLING,
        "rounds": rounds,
        "detached_window_s": DETACHED.as_secs(),
        "sampled_window_s": SAMPLED.as_secs(),
        "traced_share": traced_ns as f64 / window_ns.max(1) as f64,
        "mean_step_us": {
            "detached": d / 1e3,
            "traced": mean(&on).map(|x| x / 1e3),
            "untraced": mean(&off).map(|x| x / 1e3),
            "switching": mean(&switching).map(|x| x / 1e3),
        },
        "cost_pct": {
            "traced": cost(&on),
            "untraced": cost(&off),
            "whole_sampled_window": cost(&sampled_all),
        },
        "cost_pct_by_median_step": {"traced": cost_median(&on), "untraced": cost_median(&off)},
        "switches": switches,
        "switch_excess_us": switch_excess_ns.map(|x| x / 1e3),
        "derived_cost_pct": {"sampling": DEFAULT, "pct": derived},
        "per_round": per_round,
        "alive_after_each_round": alive,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_split_by_the_switches() {
        const MS: u64 = 1_000_000;
        // Traced 1000-2000 ms in a 0-3000 ms window.
        let spans = [(1000 * MS, 2000 * MS)];
        let steps = [
            (500 * MS, 510 * MS),   // untraced
            (1050 * MS, 1060 * MS), // just switched on
            (1500 * MS, 1510 * MS), // traced
            (1995 * MS, 2005 * MS), // spans the off switch: neither
            (2050 * MS, 2060 * MS), // just switched off
            (2500 * MS, 2510 * MS), // untraced
            (2995 * MS, 3005 * MS), // past the window
        ];
        let (on, off, switching) = split(&steps, &spans, 0, 3000 * MS);
        assert_eq!((on.len(), off.len(), switching.len()), (1, 2, 2));
    }
}
