//! Iteration cycles of a capture: the spans of its anchor's calls (the profile's anchor, or
//! one discovered from call statistics), or fixed bins when no iteration completed.

use std::collections::BTreeMap;

use pyframe_tracer::session::Call;

use super::capture::Collected;

/// One iteration cycle.
#[derive(Debug, Clone)]
pub struct CycleSpan {
    /// Start, ns.
    pub start: u64,
    /// End, ns.
    pub end: u64,
    /// Thread that ran it (0 for fixed time bins).
    pub tid: u32,
    /// Workload fields of the anchor call.
    pub args: BTreeMap<String, i64>,
}

/// Mean duration of `v`, ms (0 when empty).
pub fn mean_ms(v: &[CycleSpan]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().map(|c| (c.end - c.start) as f64).sum::<f64>() / v.len() as f64 / 1e6
    }
}

/// Fixed bins used when no anchor exists (not a Python engine, or an idle one).
const BIN_NS: u64 = 100_000_000;

/// The iteration cycles of [from, to): calls of `anchor`, or fixed bins.
pub fn cycles(calls: &[Call], anchor: Option<&str>, from: u64, to: u64) -> Vec<CycleSpan> {
    if let Some(a) = anchor {
        let mut v: Vec<CycleSpan> = calls
            .iter()
            .filter(|c| c.func == a && c.start_ns >= from && c.end_ns <= to)
            .map(|c| CycleSpan {
                start: c.start_ns,
                end: c.end_ns,
                tid: c.tid as u32,
                args: c.args.clone(),
            })
            .collect();
        v.sort_by_key(|c| c.start);
        return v;
    }
    (from..to)
        .step_by(BIN_NS as usize)
        .map(|s| CycleSpan {
            start: s,
            end: (s + BIN_NS).min(to),
            tid: 0,
            args: BTreeMap::new(),
        })
        .filter(|c| c.end > c.start)
        .collect()
}

/// The deep-dive window's cycles: its complete iterations, or, when none completed inside it
/// (a stall longer than the window, the case a deep dive matters most), 100 ms bins, whose
/// time shares compare with the reference's per-iteration shares; whether it was binned.
pub fn anomalous_cycles(
    calls: &[Call],
    anchor: Option<&str>,
    from: u64,
    to: u64,
) -> (Vec<CycleSpan>, bool) {
    let v = cycles(calls, anchor, from, to);
    if v.is_empty() && anchor.is_some() {
        (cycles(calls, None, from, to), true)
    } else {
        (v, false)
    }
}

/// The anchor of the capture: the profile's, or discovered from call statistics.
pub fn anchor(c: &Collected) -> Option<String> {
    let py = c.python.as_ref()?;
    // The profile's anchor the engine runs (vLLM has two; it calls one of them).
    let anchors: Vec<&str> = py
        .probes
        .iter()
        .filter(|p| p.role == "anchor")
        .map(|p| p.func())
        .collect();
    if let Some(first) = anchors.first() {
        let called = py.calls.iter().find(|c| anchors.contains(&c.func.as_str()));
        return Some(called.map_or(*first, |c| c.func.as_str()).to_string());
    }
    let mut by_func: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    for call in &py.calls {
        by_func
            .entry(&call.func)
            .or_default()
            .push(call.end_ns.saturating_sub(call.start_ns));
    }
    // A capture is taken because the engine stalls: the stalls are in its anchor's durations,
    // so the spread is no reason to pass a function over here.
    model::anchor::discover_in(
        by_func.iter().map(|(f, d)| (*f, d.as_slice())),
        f64::INFINITY,
    )
    .map(|s| s.func)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_without_a_complete_iteration_is_ranked_in_bins() {
        let step = |start_ns, end_ns| Call {
            func: "Engine.step".into(),
            tid: 1,
            start_ns,
            end_ns,
            args: BTreeMap::new(),
            exception: false,
        };
        let ms = 1_000_000;
        // One iteration inside [0, 300 ms): its cycle.
        let (v, binned) =
            anomalous_cycles(&[step(10 * ms, 50 * ms)], Some("Engine.step"), 0, 300 * ms);
        assert_eq!((v.len(), binned), (1, false));
        // The iteration outlasts the window: three 100 ms bins.
        let (v, binned) =
            anomalous_cycles(&[step(10 * ms, 900 * ms)], Some("Engine.step"), 0, 300 * ms);
        assert_eq!((v.len(), binned), (3, true));
        assert_eq!((v[2].start, v[2].end), (200 * ms, 300 * ms));
        // Without an anchor, bins as before.
        let (v, binned) = anomalous_cycles(&[], None, 0, 300 * ms);
        assert_eq!((v.len(), binned), (3, false));
    }
}
