//! Figures over a window of GPU events: what ran, how much of it joins its launching API call,
//! launch-to-start latency, GPU busy share, and the top kernels.

use std::collections::{BTreeMap, HashMap};

use cupti_sys::channel::Event;
use serde::Serialize;

use super::GpuEvent;

/// Percentiles of a distribution, µs.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of `v` (sorted in place); `None` when empty.
    pub fn of(v: &mut [f64]) -> Option<Percentiles> {
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Some(Percentiles {
            p50: at(0.5),
            p99: at(0.99),
            max: v[v.len() - 1],
        })
    }
}

/// One kernel name's share.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct KernelShare {
    /// Kernel name.
    pub name: String,
    /// Launches.
    pub count: u64,
    /// Total GPU time, ms.
    pub total_ms: f64,
}

/// Counts and figures of a window.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Summary {
    /// Kernels.
    pub kernels: u64,
    /// Memory copies.
    pub memcpys: u64,
    /// Memsets.
    pub memsets: u64,
    /// Runtime/driver API calls.
    pub api_calls: u64,
    /// Host synchronizations.
    pub synchronizations: u64,
    /// GPU operations (kernels, copies, memsets) whose correlation id matches an API call, %.
    pub correlated_pct: Option<f64>,
    /// Kernel start minus the start of its launching API call, µs.
    pub launch_to_start_us: Option<Percentiles>,
    /// Share of the window in which the GPU ran something (union over streams), per device, %.
    pub busy_pct: BTreeMap<u32, f64>,
    /// Kernels with the most GPU time.
    pub top_kernels: Vec<KernelShare>,
}

/// Summarises `events` over the window `[from, to]` (CLOCK_MONOTONIC ns).
pub fn summarise(events: &[GpuEvent], from: u64, to: u64) -> Summary {
    let api_start = api_starts(events);
    let (mut kernels, mut memcpys, mut memsets, mut syncs) = (0u64, 0u64, 0u64, 0u64);
    let mut joined = 0u64;
    let mut latency = Vec::new();
    let mut busy: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
    let mut per_name: HashMap<&str, (u64, u64)> = HashMap::new();
    for e in events {
        let (device, corr, start, end) = match e.event {
            Event::Kernel {
                device_id,
                correlation_id,
                start,
                end,
                ..
            } => {
                kernels += 1;
                let s = per_name
                    .entry(e.name.as_deref().unwrap_or("kernel"))
                    .or_default();
                s.0 += 1;
                s.1 += end.saturating_sub(start);
                if let Some(a) = api_start.get(&correlation_id) {
                    latency.push(start.saturating_sub(*a) as f64 / 1e3);
                }
                (device_id, correlation_id, start, end)
            }
            Event::Memcpy(m) => {
                memcpys += 1;
                (m.device_id, m.correlation_id, m.start, m.end)
            }
            Event::Memset(m) => {
                memsets += 1;
                (m.device_id, m.correlation_id, m.start, m.end)
            }
            Event::Synchronization(_) => {
                syncs += 1;
                continue;
            }
            _ => continue,
        };
        joined += u64::from(api_start.contains_key(&corr));
        busy.entry(device)
            .or_default()
            .push((start.max(from), end.min(to)));
    }
    let ops = kernels + memcpys + memsets;
    let window = to.saturating_sub(from).max(1) as f64;
    let busy_pct = busy
        .into_iter()
        .map(|(d, mut spans)| (d, 100.0 * union_ns(&mut spans) as f64 / window))
        .collect();
    let mut top: Vec<KernelShare> = per_name
        .into_iter()
        .map(|(name, (count, ns))| KernelShare {
            name: name.to_string(),
            count,
            total_ms: ns as f64 / 1e6,
        })
        .collect();
    top.sort_by(|a, b| b.total_ms.total_cmp(&a.total_ms).then(a.name.cmp(&b.name)));
    top.truncate(10);
    Summary {
        kernels,
        memcpys,
        memsets,
        api_calls: api_start.len() as u64,
        synchronizations: syncs,
        correlated_pct: (ops > 0).then(|| 100.0 * joined as f64 / ops as f64),
        launch_to_start_us: Percentiles::of(&mut latency),
        busy_pct,
        top_kernels: top,
    }
}

/// The GPU inside one iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct IterationGpu {
    /// Time the GPU ran something for the engine inside the iteration (union over streams), µs.
    pub busy_us: f64,
    /// Share of the iteration in which the GPU ran nothing ("void", as XPUTimer defines it).
    pub void_ratio: f64,
    /// Kernels that started inside the iteration.
    pub kernels: u64,
    /// Start minus launching-call start of those kernels, µs.
    pub launch_us: Vec<f64>,
}

/// Start of the launching API call of each correlation id in `events`. When a runtime call
/// and the driver call inside it share an id, the outer (earliest) start is kept, whatever
/// order they arrived in.
pub fn api_starts<'a>(events: impl IntoIterator<Item = &'a GpuEvent>) -> HashMap<u32, u64> {
    let mut starts = HashMap::new();
    for e in events {
        if let Event::Api(a) = e.event {
            note_api_start(&mut starts, a.correlation_id, a.start);
        }
    }
    starts
}

/// Adds one API call's start to a map built by [`api_starts`].
pub fn note_api_start(starts: &mut HashMap<u32, u64>, correlation_id: u32, start: u64) {
    starts
        .entry(correlation_id)
        .and_modify(|s| *s = (*s).min(start))
        .or_insert(start);
}

/// What the GPU did during the iteration `[start, end]` (CLOCK_MONOTONIC ns), from the
/// events of each engine process with its [`api_starts`] (correlation ids are per process).
pub fn iteration<'a, E>(
    processes: impl IntoIterator<Item = (E, &'a HashMap<u32, u64>)>,
    start: u64,
    end: u64,
) -> IterationGpu
where
    E: IntoIterator<Item = &'a GpuEvent>,
{
    let mut spans = Vec::new();
    let mut kernels = 0;
    let mut launch_us = Vec::new();
    for (events, api) in processes {
        for e in events {
            let (s, t) = match e.event {
                Event::Kernel {
                    start: s,
                    end: t,
                    correlation_id,
                    ..
                } => {
                    if (start..end).contains(&s) {
                        kernels += 1;
                        if let Some(a) = api.get(&correlation_id) {
                            launch_us.push(s.saturating_sub(*a) as f64 / 1e3);
                        }
                    }
                    (s, t)
                }
                Event::Memcpy(m) => (m.start, m.end),
                Event::Memset(m) => (m.start, m.end),
                _ => continue,
            };
            if t > start && s < end {
                spans.push((s.max(start), t.min(end)));
            }
        }
    }
    let busy = union_ns(&mut spans);
    let length = end.saturating_sub(start).max(1);
    IterationGpu {
        busy_us: busy as f64 / 1e3,
        void_ratio: 1.0 - busy as f64 / length as f64,
        kernels,
        launch_us,
    }
}

/// Total length of the union of `spans` (sorted in place).
pub fn union_ns(spans: &mut [(u64, u64)]) -> u64 {
    spans.sort_unstable();
    let mut total = 0;
    let mut cur: Option<(u64, u64)> = None;
    for &(s, e) in spans.iter().filter(|(s, e)| e > s) {
        cur = match cur {
            Some((cs, ce)) if s <= ce => Some((cs, ce.max(e))),
            Some((cs, ce)) => {
                total += ce - cs;
                Some((s, e))
            }
            None => Some((s, e)),
        };
    }
    total + cur.map_or(0, |(s, e)| e - s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cupti_sys::record::{Api, ApiDomain, Memcpy};

    fn kernel(corr: u32, start: u64, end: u64, name: &str) -> GpuEvent {
        GpuEvent {
            event: Event::Kernel {
                start,
                end,
                device_id: 0,
                stream_id: 7,
                correlation_id: corr,
                name_id: 1,
                threads: 1,
                graph_id: 0,
            },
            name: Some(name.into()),
        }
    }

    fn api(corr: u32, start: u64) -> GpuEvent {
        GpuEvent {
            event: Event::Api(Api {
                domain: ApiDomain::Runtime,
                cbid: 211,
                start,
                end: start + 5,
                process_id: 1,
                thread_id: 1,
                correlation_id: corr,
                return_value: 0,
            }),
            name: None,
        }
    }

    #[test]
    fn joins_latency_busy_share_and_top_kernels() {
        let events = vec![
            api(1, 0),
            kernel(1, 10, 110, "gemm"),
            api(2, 100),
            kernel(2, 130, 180, "softmax"),
            kernel(3, 150, 250, "gemm"), // overlaps the previous one; no API call seen
            GpuEvent {
                event: Event::Memcpy(Memcpy {
                    correlation_id: 4,
                    start: 400,
                    end: 500,
                    ..Memcpy::default()
                }),
                name: None,
            },
        ];
        let s = summarise(&events, 0, 1000);
        assert_eq!((s.kernels, s.memcpys, s.api_calls), (3, 1, 2));
        assert_eq!(s.correlated_pct, Some(50.0));
        let l = s.launch_to_start_us.unwrap();
        assert_eq!((l.p50, l.max), (0.03, 0.03));
        // Busy: [10, 110], [130, 250] and [400, 500] → 320 of 1000 ns.
        assert_eq!(s.busy_pct[&0], 32.0);
        assert_eq!(s.top_kernels[0].name, "gemm");
        assert_eq!(s.top_kernels[0].count, 2);
        assert!((s.top_kernels[0].total_ms - 200e-6).abs() < 1e-12);
    }

    #[test]
    fn an_iteration_sees_its_busy_share_and_launch_latency() {
        let events = [
            api(1, 0),
            kernel(1, 10, 110, "gemm"),
            api(2, 100),
            kernel(2, 130, 180, "softmax"),
            kernel(3, 900, 1100, "late"),
        ];
        // Iteration [50, 1000]: busy 50..110, 130..180, 900..1000 = 210 of 950 ns.
        let g = iteration([(events.iter(), &api_starts(&events))], 50, 1000);
        assert_eq!(g.kernels, 2); // softmax and late start inside; gemm began before
        assert!((g.busy_us - 0.21).abs() < 1e-9, "{g:?}");
        assert!((g.void_ratio - (1.0 - 210.0 / 950.0)).abs() < 1e-9);
        assert_eq!(g.launch_us, vec![0.03]);
    }

    #[test]
    fn the_outer_call_of_a_shared_correlation_id_counts_whatever_the_order() {
        // The driver call (inside the runtime call) may be delivered first.
        let starts = api_starts(&[api(7, 50), api(7, 20), api(8, 90)]);
        assert_eq!(starts[&7], 20);
        assert_eq!(starts[&8], 90);
    }

    #[test]
    fn correlation_ids_are_joined_within_their_own_process() {
        // Two processes both use correlation id 1; each kernel joins its own launch.
        let a = [api(1, 0), kernel(1, 100, 200, "a")];
        let b = [api(1, 60), kernel(1, 150, 300, "b")];
        let (sa, sb) = (api_starts(&a), api_starts(&b));
        let g = iteration([(a.iter(), &sa), (b.iter(), &sb)], 0, 1000);
        assert_eq!(g.kernels, 2);
        assert_eq!(g.launch_us, vec![0.1, 0.09]);
        // Union of 100..200 and 150..300.
        assert!((g.busy_us - 0.2).abs() < 1e-9, "{g:?}");
    }

    #[test]
    fn union_merges_overlaps_and_skips_empty_spans() {
        let mut v = vec![(5, 10), (0, 3), (2, 4), (8, 12), (20, 20)];
        assert_eq!(union_ns(&mut v), 4 + 7);
        assert_eq!(union_ns(&mut []), 0);
    }
}
