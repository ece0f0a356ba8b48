//! GPU events as Perfetto tracks: one track per (device, stream) with kernel, copy and memset
//! slices; under each calling thread a "CUDA API" track (each call starts a flow that ends
//! at the GPU work it launched, by correlation id) and a "CUDA sync" track.

use std::{collections::BTreeMap, io::Write};

use cupti_sys::{channel::Event, memcpy_kind_name, record::Memcpy, synchronization_name};
use perfetto_writer::{Arg, Extra, TraceWriter, Track, Value};

use super::GpuEvent;

/// Flow ids are correlation ids in their own range, clear of any other flows in the trace.
const FLOW_BASE: u64 = 0x6770_7500_0000_0000;

/// One slice to draw.
struct Item<'a> {
    start: u64,
    end: u64,
    name: String,
    args: Vec<Arg<'a>>,
    flow: Option<u64>,
    terminates: bool,
}

/// Where GPU work goes: a stream track per (device, stream), thread sub-tracks by tid.
#[derive(Default)]
struct Tracks<'a> {
    streams: BTreeMap<(u32, u32), Vec<Item<'a>>>,
    api: BTreeMap<u32, Vec<Item<'a>>>,
    sync: BTreeMap<u32, Vec<Item<'a>>>,
}

fn copy_name(m: &Memcpy) -> String {
    format!("{} {} B", memcpy_kind_name(m.copy_kind), m.bytes)
}

/// Writes `events` under `process`; `thread` gives (creating on first use) the track of a
/// thread of the process. Returns the number of slices written.
pub fn write<W: Write>(
    w: &mut TraceWriter<W>,
    process: Track,
    thread: &mut dyn FnMut(&mut TraceWriter<W>, u32) -> std::io::Result<Track>,
    events: &[GpuEvent],
) -> std::io::Result<u64> {
    let mut t = Tracks::default();
    let api_corr: std::collections::HashSet<u32> = events
        .iter()
        .filter_map(|e| match e.event {
            Event::Api(a) => Some(a.correlation_id),
            _ => None,
        })
        .collect();
    let ends_flow = |corr: u32| {
        api_corr
            .contains(&corr)
            .then_some(FLOW_BASE + u64::from(corr))
    };
    for e in events {
        match e.event {
            Event::Kernel {
                start,
                end,
                device_id,
                stream_id,
                correlation_id,
                threads,
                ..
            } => t
                .streams
                .entry((device_id, stream_id))
                .or_default()
                .push(Item {
                    start,
                    end,
                    name: e.name.clone().unwrap_or_else(|| "kernel".into()),
                    args: vec![
                        Arg::new("correlation_id", Value::Int(correlation_id.into())),
                        Arg::new("threads", Value::Int(threads as i64)),
                    ],
                    flow: ends_flow(correlation_id),
                    terminates: true,
                }),
            Event::Memcpy(m) => t
                .streams
                .entry((m.device_id, m.stream_id))
                .or_default()
                .push(Item {
                    start: m.start,
                    end: m.end,
                    name: copy_name(&m),
                    args: vec![
                        Arg::new("correlation_id", Value::Int(m.correlation_id.into())),
                        Arg::new("bytes", Value::Int(m.bytes as i64)),
                    ],
                    flow: ends_flow(m.correlation_id),
                    terminates: true,
                }),
            Event::Memset(m) => t
                .streams
                .entry((m.device_id, m.stream_id))
                .or_default()
                .push(Item {
                    start: m.start,
                    end: m.end,
                    name: format!("memset {} B", m.bytes),
                    args: vec![Arg::new(
                        "correlation_id",
                        Value::Int(m.correlation_id.into()),
                    )],
                    flow: ends_flow(m.correlation_id),
                    terminates: true,
                }),
            Event::Api(a) => t.api.entry(a.thread_id).or_default().push(Item {
                start: a.start,
                end: a.end,
                name: cupti_sys::api_name(a.domain, a.cbid).into_owned(),
                args: vec![
                    Arg::new("correlation_id", Value::Int(a.correlation_id.into())),
                    Arg::new("return", Value::Int(a.return_value.into())),
                ],
                flow: Some(FLOW_BASE + u64::from(a.correlation_id)),
                terminates: false,
            }),
            Event::Synchronization(s) => t.sync.entry(s.stream_id).or_default().push(Item {
                start: s.start,
                end: s.end,
                name: synchronization_name(s.sync_type).into(),
                args: vec![Arg::new(
                    "correlation_id",
                    Value::Int(s.correlation_id.into()),
                )],
                flow: None,
                terminates: false,
            }),
            _ => {}
        }
    }
    let mut slices = 0;
    for ((device, stream), items) in &mut t.streams {
        let track = w.child(process, &format!("GPU {device} stream {stream}"))?;
        slices += draw(w, track, items)?;
    }
    // API calls go under their thread; synchronizations have no thread in CUPTI's record, so
    // they go under the process, per stream.
    for (tid, items) in &mut t.api {
        let parent = thread(w, *tid)?;
        let track = w.child(parent, "CUDA API")?;
        slices += draw(w, track, items)?;
    }
    for (stream, items) in &mut t.sync {
        let track = w.child(process, &format!("CUDA sync (stream {stream})"))?;
        slices += draw(w, track, items)?;
    }
    Ok(slices)
}

/// Draws `items` in time order as non-overlapping slices (a slice starting before the
/// previous one ended is moved to its end: one stream runs one thing at a time).
fn draw<W: Write>(
    w: &mut TraceWriter<W>,
    track: Track,
    items: &mut [Item<'_>],
) -> std::io::Result<u64> {
    items.sort_by_key(|i| (i.start, i.end));
    let mut last_end = 0;
    for i in items.iter() {
        let start = i.start.max(last_end);
        let end = i.end.max(start);
        let flows: Vec<u64> = i.flow.into_iter().collect();
        let (starting, ending): (&[u64], &[u64]) = if i.terminates {
            (&[], &flows)
        } else {
            (&flows, &[])
        };
        w.begin(
            track,
            start,
            &i.name,
            Extra {
                args: &i.args,
                flows: starting,
                terminating_flows: ending,
            },
        )?;
        w.end(track, end)?;
        last_end = end;
    }
    Ok(items.len() as u64)
}
