//! Reads a trace back and checks it the way a viewer depends on it: every track defined
//! before use, every interned id resolved, per-track time order, every slice closed and
//! slices properly nested. Returns the resolved tracks, slices, instants and counter values.
//!
//! Interned names, packet defaults (clock and track) and sequence-scoped clocks (ids
//! 64..128, incremental or not) are kept per packet sequence, as Perfetto's trace processor
//! keeps them; every stamp is resolved to CLOCK_MONOTONIC.

use std::collections::{BTreeMap, HashMap};

use prost::Message;

use crate::pb::{debug_annotation, trace_packet, track_event, Trace};

/// What a track is.
#[derive(Debug, Clone, PartialEq)]
pub enum TrackKind {
    /// A process track.
    Process {
        /// Process id.
        pid: u32,
    },
    /// A thread's own track.
    Thread {
        /// Process id.
        pid: u32,
        /// Thread id.
        tid: u32,
    },
    /// A named slice track under another track.
    Child,
    /// A counter track.
    Counter,
}

/// A track descriptor, resolved.
#[derive(Debug, Clone)]
pub struct TrackInfo {
    /// Uuid.
    pub uuid: u64,
    /// Parent track's uuid, if any.
    pub parent: Option<u64>,
    /// Track, process or thread name.
    pub name: String,
    /// Kind.
    pub kind: TrackKind,
}

/// A decoded debug-annotation value.
#[derive(Debug, Clone, PartialEq)]
pub enum ArgValue {
    /// Signed.
    Int(i64),
    /// Unsigned.
    Uint(u64),
    /// Floating point.
    Double(f64),
    /// Text.
    Str(String),
    /// Boolean.
    Bool(bool),
}

impl ArgValue {
    /// The value as f64, when numeric.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            ArgValue::Int(v) => Some(v as f64),
            ArgValue::Uint(v) => Some(v as f64),
            ArgValue::Double(v) => Some(v),
            _ => None,
        }
    }
}

/// A closed slice.
#[derive(Debug, Clone)]
pub struct Slice {
    /// Track uuid.
    pub track: u64,
    /// Resolved name.
    pub name: String,
    /// Begin, ns (trace clock).
    pub start: u64,
    /// End, ns.
    pub end: u64,
    /// Nesting depth on its track (0 = outermost).
    pub depth: usize,
    /// Debug annotations.
    pub args: BTreeMap<String, ArgValue>,
    /// Flow ids (starting or passing) and terminating flow ids.
    pub flows: Vec<u64>,
}

/// An instant event.
#[derive(Debug, Clone)]
pub struct Instant {
    /// Track uuid.
    pub track: u64,
    /// Resolved name.
    pub name: String,
    /// When, ns.
    pub ts: u64,
    /// Debug annotations.
    pub args: BTreeMap<String, ArgValue>,
}

/// A decoded, validated trace.
#[derive(Debug, Default)]
pub struct Decoded {
    /// Tracks by uuid.
    pub tracks: HashMap<u64, TrackInfo>,
    /// Slices, in end order.
    pub slices: Vec<Slice>,
    /// Instant events.
    pub instants: Vec<Instant>,
    /// Counter values: (track, ts, value).
    pub counters: Vec<(u64, u64, f64)>,
    /// Clock readings of the clock snapshot: (builtin clock id, ns).
    pub clocks: Vec<(u32, u64)>,
    /// Packets in the file.
    pub packets: usize,
}

impl Decoded {
    /// Tracks whose name is `name`.
    pub fn tracks_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a TrackInfo> {
        self.tracks.values().filter(move |t| t.name == name)
    }

    /// The thread a track belongs to (a thread track or a track under one).
    pub fn thread_of(&self, mut uuid: u64) -> Option<u32> {
        for _ in 0..16 {
            let t = self.tracks.get(&uuid)?;
            if let TrackKind::Thread { tid, .. } = t.kind {
                return Some(tid);
            }
            uuid = t.parent?;
        }
        None
    }
}

/// CLOCK_MONOTONIC's builtin id.
const MONOTONIC: u32 = 3;

/// A sequence-scoped clock: where a snapshot put it against CLOCK_MONOTONIC, and for an
/// incremental one its last value.
struct SequenceClock {
    incremental: bool,
    at: u64,
    monotonic_at: u64,
    last: u64,
}

/// What a packet sequence carries from packet to packet.
#[derive(Default)]
struct Sequence {
    names: HashMap<u64, String>,
    arg_names: HashMap<u64, String>,
    default_clock: Option<u32>,
    default_track: Option<u64>,
    clocks: HashMap<u32, SequenceClock>,
}

impl Sequence {
    /// `ts` in `clock` (the packet's, else the sequence's default) as CLOCK_MONOTONIC ns.
    fn monotonic(&mut self, clock: Option<u32>, ts: u64) -> Result<u64, String> {
        match clock.or(self.default_clock) {
            Some(MONOTONIC) => Ok(ts),
            Some(id) => {
                let c = self
                    .clocks
                    .get_mut(&id)
                    .ok_or_else(|| format!("stamp on clock {id}, which no snapshot defined"))?;
                let value = if c.incremental {
                    c.last = c.last.wrapping_add(ts);
                    c.last
                } else {
                    ts
                };
                Ok(c.monotonic_at.wrapping_add(value.wrapping_sub(c.at)))
            }
            None => Err("stamp without a clock".into()),
        }
    }
}

#[derive(Default)]
struct Open {
    name: String,
    start: u64,
    args: BTreeMap<String, ArgValue>,
    flows: Vec<u64>,
}

/// Decodes `bytes` and validates it; the error lists every problem found (up to 20).
pub fn decode(bytes: &[u8]) -> Result<Decoded, String> {
    let trace = Trace::decode(bytes).map_err(|e| format!("not a Perfetto trace: {e}"))?;
    let mut out = Decoded {
        packets: trace.packet.len(),
        ..Decoded::default()
    };
    let mut problems = Vec::new();
    let mut sequences: HashMap<u32, Sequence> = HashMap::new();
    let mut last_ts: HashMap<u64, u64> = HashMap::new();
    let mut open: HashMap<u64, Vec<Open>> = HashMap::new();
    for (i, p) in trace.packet.into_iter().enumerate() {
        let seq_id = match p.optional_trusted_packet_sequence_id {
            Some(trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(id)) => id,
            None => 0,
        };
        if p.sequence_flags() & 1 != 0 {
            sequences.insert(seq_id, Sequence::default());
        }
        let seq = sequences.entry(seq_id).or_default();
        if let Some(d) = &p.trace_packet_defaults {
            seq.default_clock = d.timestamp_clock_id;
            seq.default_track = d.track_event_defaults.as_ref().and_then(|t| t.track_uuid);
        }
        if let Some(data) = &p.interned_data {
            for n in &data.event_names {
                seq.names.insert(n.iid(), n.name().to_string());
            }
            for n in &data.debug_annotation_names {
                seq.arg_names.insert(n.iid(), n.name().to_string());
            }
        }
        match p.data {
            Some(trace_packet::Data::ClockSnapshot(c)) => {
                let scoped = |id: u32| (64..128).contains(&id);
                if !c.clocks.iter().any(|c| scoped(c.clock_id())) {
                    out.clocks = c
                        .clocks
                        .iter()
                        .map(|c| (c.clock_id(), c.timestamp()))
                        .collect();
                    continue;
                }
                let Some(monotonic_at) = c
                    .clocks
                    .iter()
                    .find(|c| c.clock_id() == MONOTONIC)
                    .map(|c| c.timestamp())
                else {
                    problems.push(format!(
                        "packet {i}: a sequence clock's snapshot without CLOCK_MONOTONIC"
                    ));
                    continue;
                };
                for c in c.clocks.iter().filter(|c| scoped(c.clock_id())) {
                    seq.clocks.insert(
                        c.clock_id(),
                        SequenceClock {
                            incremental: c.is_incremental(),
                            at: c.timestamp(),
                            monotonic_at,
                            last: c.timestamp(),
                        },
                    );
                }
            }
            Some(trace_packet::Data::TrackDescriptor(d)) => {
                let kind = if let Some(t) = &d.thread {
                    TrackKind::Thread {
                        pid: t.pid() as u32,
                        tid: t.tid() as u32,
                    }
                } else if let Some(p) = &d.process {
                    TrackKind::Process {
                        pid: p.pid() as u32,
                    }
                } else if d.counter.is_some() {
                    TrackKind::Counter
                } else {
                    TrackKind::Child
                };
                if let Some(parent) = d.parent_uuid {
                    if !out.tracks.contains_key(&parent) {
                        problems.push(format!(
                            "packet {i}: track {} has an undefined parent {parent}",
                            d.uuid()
                        ));
                    }
                }
                let name = d
                    .name
                    .clone()
                    .or_else(|| d.thread.as_ref().map(|t| t.thread_name().to_string()))
                    .or_else(|| d.process.as_ref().map(|p| p.process_name().to_string()))
                    .unwrap_or_default();
                out.tracks.insert(
                    d.uuid(),
                    TrackInfo {
                        uuid: d.uuid(),
                        parent: d.parent_uuid,
                        name,
                        kind,
                    },
                );
            }
            Some(trace_packet::Data::TrackEvent(e)) => {
                let Some(stamp) = p.timestamp else {
                    problems.push(format!("packet {i}: track event without a timestamp"));
                    continue;
                };
                let ts = match seq.monotonic(p.timestamp_clock_id, stamp) {
                    Ok(ts) => ts,
                    Err(e) => {
                        problems.push(format!("packet {i}: {e}"));
                        continue;
                    }
                };
                let Some(track) = e.track_uuid.or(seq.default_track) else {
                    problems.push(format!("packet {i}: event without a track"));
                    continue;
                };
                let Some(info) = out.tracks.get(&track) else {
                    problems.push(format!("packet {i}: event on undefined track {track}"));
                    continue;
                };
                let last = last_ts.entry(track).or_insert(0);
                if ts < *last {
                    problems.push(format!(
                        "packet {i}: track {track} ({}) goes back in time: {ts} < {last}",
                        info.name
                    ));
                }
                *last = ts;
                let name = match e.name_field.clone() {
                    Some(track_event::NameField::NameIid(iid)) => match seq.names.get(&iid) {
                        Some(n) => n.clone(),
                        None => {
                            problems.push(format!("packet {i}: unresolved event name iid {iid}"));
                            String::new()
                        }
                    },
                    Some(track_event::NameField::Name(n)) => n,
                    None => String::new(),
                };
                let mut args = BTreeMap::new();
                for a in &e.debug_annotations {
                    let key = match &a.name_field {
                        Some(debug_annotation::NameField::NameIid(iid)) => {
                            match seq.arg_names.get(iid) {
                                Some(n) => n.clone(),
                                None => {
                                    problems.push(format!(
                                        "packet {i}: unresolved annotation name iid {iid}"
                                    ));
                                    continue;
                                }
                            }
                        }
                        Some(debug_annotation::NameField::Name(n)) => n.clone(),
                        None => continue,
                    };
                    let value = match &a.value {
                        Some(debug_annotation::Value::IntValue(v)) => ArgValue::Int(*v),
                        Some(debug_annotation::Value::UintValue(v)) => ArgValue::Uint(*v),
                        Some(debug_annotation::Value::DoubleValue(v)) => ArgValue::Double(*v),
                        Some(debug_annotation::Value::StringValue(v)) => ArgValue::Str(v.clone()),
                        Some(debug_annotation::Value::BoolValue(v)) => ArgValue::Bool(*v),
                        None => continue,
                    };
                    args.insert(key, value);
                }
                let is_counter_track = info.kind == TrackKind::Counter;
                let flows: Vec<u64> = e
                    .flow_ids
                    .iter()
                    .chain(&e.terminating_flow_ids)
                    .copied()
                    .collect();
                match e.r#type() {
                    track_event::Type::Counter => {
                        if !is_counter_track {
                            problems
                                .push(format!("packet {i}: counter value on slice track {track}"));
                        }
                        let v = match e.counter_value_field {
                            Some(track_event::CounterValueField::DoubleCounterValue(v)) => v,
                            Some(track_event::CounterValueField::CounterValue(v)) => v as f64,
                            None => f64::NAN,
                        };
                        out.counters.push((track, ts, v));
                    }
                    _ if is_counter_track => {
                        problems.push(format!("packet {i}: slice event on counter track {track}"));
                    }
                    track_event::Type::SliceBegin => open.entry(track).or_default().push(Open {
                        name,
                        start: ts,
                        args,
                        flows,
                    }),
                    track_event::Type::SliceEnd => {
                        let stack = open.entry(track).or_default();
                        match stack.pop() {
                            Some(o) => out.slices.push(Slice {
                                track,
                                name: o.name,
                                start: o.start,
                                end: ts,
                                depth: stack.len(),
                                args: o.args,
                                flows: o.flows,
                            }),
                            None => problems.push(format!(
                                "packet {i}: slice end on track {track} with no open slice"
                            )),
                        }
                    }
                    track_event::Type::Instant => out.instants.push(Instant {
                        track,
                        name,
                        ts,
                        args,
                    }),
                    track_event::Type::Unspecified => {
                        problems.push(format!("packet {i}: track event without a type"))
                    }
                }
            }
            None => {}
        }
    }
    for (track, stack) in &open {
        for o in stack {
            problems.push(format!(
                "slice {:?} on track {track} opened at {} is never closed",
                o.name, o.start
            ));
        }
    }
    if out.clocks.is_empty() {
        problems.push("no clock snapshot".into());
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        problems.truncate(20);
        Err(problems.join("\n"))
    }
}
