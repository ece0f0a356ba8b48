//! Root-cause ranking of a slow window against a normal reference of the same process
//! (LatencyPrism §5.3.2).
//!
//! Each iteration cycle is described by the time share β of every event (a Python function,
//! a syscall, a thread state) inside the cycle, and the mean utilisation μ of every telemetry
//! series during it. Against the normal cycles' distribution, an event's shift is
//! Z_β = Δβ / σ_β and the shift of the resource it uses is Z_μ = Δ log1p(μ) / σ_log1p(μ);
//! the suspect's score is |Δβ| · (|Z_β| + max(Z_μ, 0)). An event that takes more of the cycle
//! than usual, while the resource it waits on is busier than usual, ranks first; a resource
//! that got quieter explains nothing and adds nothing (with |Z_μ|, an engine thread running a
//! little longer while CPU pressure fell outranked the worker's blocked time under reclaim).
//! Events whose share grew rank before events whose share shrank.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// What kind of event a suspect is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// Time a thread spent in a scheduler state (running, runnable, sleeping, blocked).
    ThreadState,
    /// Time inside a syscall.
    Syscall,
    /// Time inside a Python function.
    Python,
}

/// One event's identity and the telemetry series it depends on.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct EventKey {
    /// Kind.
    pub kind: EventKind,
    /// Name, e.g. `runnable VLLM::Worker`, `fsync`, `vllm.v1.worker:Worker.execute_model`.
    pub name: String,
}

/// One iteration cycle's features.
#[derive(Debug, Clone, Default)]
pub struct Cycle {
    /// Time share of each event in the cycle (event time / cycle time; summed over the
    /// threads it covers, so it may exceed 1).
    pub shares: BTreeMap<EventKey, f64>,
    /// Mean utilisation of each telemetry series during the cycle (percent or rate).
    pub utilisation: BTreeMap<String, f64>,
}

/// A ranked suspect.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Suspect {
    /// Event name.
    pub name: String,
    /// Event kind.
    pub kind: EventKind,
    /// |Δβ| · (|Z_β| + max(Z_μ, 0)).
    pub score: f64,
    /// Mean share in the anomalous window minus mean share in the normal one.
    pub delta_beta: f64,
    /// Δβ in units of the normal cycles' standard deviation.
    pub z_beta: f64,
    /// Shift of log1p(μ) of the event's resource, in units of its normal deviation (the
    /// largest in magnitude among the event's series; 0 when it has none).
    pub z_mu: f64,
    /// The telemetry series that gave `z_mu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// Mean share in the normal cycles.
    pub normal_beta: f64,
    /// Mean share in the anomalous cycles.
    pub anomalous_beta: f64,
}

/// A telemetry series' shift (reported next to the suspects).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SeriesShift {
    /// Series name.
    pub name: String,
    /// Mean over the normal cycles.
    pub normal_mean: f64,
    /// Mean over the anomalous cycles.
    pub anomalous_mean: f64,
    /// Z of log1p(μ).
    pub z: f64,
}

/// Floors under the normal deviations: a share or utilisation that never moved in the
/// reference must still move by a meaningful amount to count (1 % of a cycle; 5 % in log1p).
const SIGMA_FLOOR_BETA: f64 = 0.01;
const SIGMA_FLOOR_LOG_MU: f64 = 0.05;

/// Ranks events by score. `resources(event)` names the telemetry series an event depends on.
pub fn rank(
    normal: &[Cycle],
    anomalous: &[Cycle],
    resources: impl Fn(&EventKey) -> Vec<String>,
) -> (Vec<Suspect>, Vec<SeriesShift>) {
    if normal.is_empty() || anomalous.is_empty() {
        return (Vec::new(), Vec::new());
    }
    let series: BTreeSet<&String> = normal
        .iter()
        .chain(anomalous)
        .flat_map(|c| c.utilisation.keys())
        .collect();
    let shifts: BTreeMap<String, SeriesShift> = series
        .into_iter()
        .map(|s| {
            let get = |c: &Cycle| c.utilisation.get(s).copied().unwrap_or(0.0);
            let (nm, ns) = mean_sd(normal.iter().map(|c| get(c).max(0.0).ln_1p()));
            let (am, _) = mean_sd(anomalous.iter().map(|c| get(c).max(0.0).ln_1p()));
            let shift = SeriesShift {
                name: s.clone(),
                normal_mean: mean_sd(normal.iter().map(get)).0,
                anomalous_mean: mean_sd(anomalous.iter().map(get)).0,
                z: (am - nm) / ns.max(SIGMA_FLOOR_LOG_MU),
            };
            (s.clone(), shift)
        })
        .collect();
    let events: BTreeSet<&EventKey> = normal
        .iter()
        .chain(anomalous)
        .flat_map(|c| c.shares.keys())
        .collect();
    let mut suspects: Vec<Suspect> = events
        .into_iter()
        .map(|e| {
            let get = |c: &Cycle| c.shares.get(e).copied().unwrap_or(0.0);
            let (nm, ns) = mean_sd(normal.iter().map(get));
            let (am, _) = mean_sd(anomalous.iter().map(get));
            let delta = am - nm;
            let z_beta = delta / ns.max(SIGMA_FLOOR_BETA);
            let (resource, z_mu) = resources(e)
                .into_iter()
                .filter_map(|r| shifts.get(&r).map(|s| (Some(r), s.z)))
                .max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()))
                .unwrap_or((None, 0.0));
            Suspect {
                name: e.name.clone(),
                kind: e.kind,
                score: 0.0,
                delta_beta: delta,
                z_beta,
                z_mu,
                resource,
                normal_beta: nm,
                anomalous_beta: am,
            }
        })
        .collect();
    order(&mut suspects);
    let mut shifts: Vec<SeriesShift> = shifts.into_values().collect();
    shifts.sort_by(|a, b| b.z.abs().total_cmp(&a.z.abs()));
    (suspects, shifts)
}

/// Scores `suspects` from their shifts and sorts them, best first: also how suspects saved by
/// an earlier build are ranked again.
pub fn order(suspects: &mut [Suspect]) {
    for s in suspects.iter_mut() {
        s.score = s.delta_beta.abs() * (s.z_beta.abs() + s.z_mu.max(0.0));
    }
    // An event that took less of the cycle cannot explain a slower cycle: events that grew
    // rank before those that shrank (a shrinking "running" share mirrors a growing
    // "runnable" one with the same score), each group by score.
    suspects.sort_by(|a, b| {
        (b.delta_beta > 0.0)
            .cmp(&(a.delta_beta > 0.0))
            .then(b.score.total_cmp(&a.score))
    });
}

/// Mean and population standard deviation.
fn mean_sd(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let v: Vec<f64> = values.collect();
    if v.is_empty() {
        return (0.0, 0.0);
    }
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n;
    (m, var.sqrt())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(kind: EventKind, name: &str) -> EventKey {
        EventKey {
            kind,
            name: name.into(),
        }
    }

    fn cycle(runnable: f64, python: f64, cpu: f64, io: f64) -> Cycle {
        Cycle {
            shares: [
                (key(EventKind::ThreadState, "runnable w"), runnable),
                (key(EventKind::Python, "f"), python),
            ]
            .into(),
            utilisation: [("cpu".to_string(), cpu), ("psi.io".to_string(), io)].into(),
        }
    }

    #[test]
    fn the_event_that_grew_with_its_busier_resource_ranks_first() {
        let normal: Vec<Cycle> = (0..20)
            .map(|i| {
                cycle(
                    0.02 + 0.001 * (i % 3) as f64,
                    0.5,
                    50.0 + (i % 5) as f64,
                    0.0,
                )
            })
            .collect();
        // Runnable time grows to 30 % of the cycle while the CPUs are saturated; the Python
        // function's share moves a little.
        let anomalous: Vec<Cycle> = (0..10).map(|_| cycle(0.30, 0.45, 98.0, 0.0)).collect();
        let (suspects, shifts) = rank(&normal, &anomalous, |e| match e.kind {
            EventKind::ThreadState => vec!["cpu".into()],
            _ => vec![],
        });
        assert_eq!(suspects[0].name, "runnable w");
        assert_eq!(suspects[0].resource.as_deref(), Some("cpu"));
        assert!(suspects[0].z_mu > 3.0, "{:?}", suspects[0]);
        assert!((suspects[0].delta_beta - 0.279).abs() < 0.01);
        assert!(suspects[0].score > suspects[1].score * 10.0);
        // A mirror image (the same |Δβ| and Z, but shrinking) ranks after the grown event.
        let mirror = |c: &Cycle, sign: f64| {
            let mut c = c.clone();
            let r = c.shares[&key(EventKind::ThreadState, "runnable w")];
            c.shares
                .insert(key(EventKind::ThreadState, "running w"), 1.0 - sign * r);
            c
        };
        let n: Vec<Cycle> = normal.iter().map(|c| mirror(c, 1.0)).collect();
        let a: Vec<Cycle> = anomalous.iter().map(|c| mirror(c, 1.0)).collect();
        let (s, _) = rank(&n, &a, |_| vec!["cpu".into()]);
        assert_eq!(s[0].name, "runnable w");
        assert_eq!(s[1].name, "running w");
        assert!((s[0].score - s[1].score).abs() < 1e-9);
        assert_eq!(shifts[0].name, "cpu");
    }

    /// A grown share whose resource got quieter ranks by its own shift alone, after a
    /// smaller grown share whose resource got busier.
    #[test]
    fn a_quieter_resource_adds_nothing_to_the_score() {
        let normal: Vec<Cycle> = (0..20)
            .map(|i| {
                cycle(
                    0.02 + 0.002 * (i % 3) as f64,
                    0.5 + 0.05 * (i % 2) as f64,
                    50.0 + (i % 5) as f64,
                    5.0 + (i % 3) as f64,
                )
            })
            .collect();
        // The Python share grows by 0.08 (Z ~3) while the CPU gets much quieter; runnable
        // time grows by 0.03 (Z ~3.7) while I/O pressure rises.
        let anomalous: Vec<Cycle> = (0..10).map(|_| cycle(0.052, 0.605, 20.0, 40.0)).collect();
        let (s, _) = rank(&normal, &anomalous, |e| match e.kind {
            EventKind::ThreadState => vec!["psi.io".into()],
            _ => vec!["cpu".into()],
        });
        let f = s.iter().find(|s| s.name == "f").unwrap();
        assert!(f.z_mu < -3.0, "{f:?}");
        assert!((f.score - f.delta_beta * f.z_beta).abs() < 1e-9, "{f:?}");
        assert_eq!(s[0].name, "runnable w", "{s:?}");
    }

    #[test]
    fn no_reference_no_suspects() {
        let (s, _) = rank(&[], &[cycle(0.3, 0.4, 90.0, 0.0)], |_| vec![]);
        assert!(s.is_empty());
    }
}
