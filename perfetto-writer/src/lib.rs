//! Streaming writer for Perfetto protobuf traces, and a reader that validates them.
//!
//! The writer emits a first packet sequence with the clock snapshot (CLOCK_MONOTONIC,
//! BOOTTIME and REALTIME read together, MONOTONIC the trace's clock) and the track
//! descriptors. Each track's events then go on a packet sequence of their own, opened at the
//! track's first event, whose defaults name the track and a sequence-scoped incremental
//! clock: an event carries neither its track nor an absolute stamp, only the nanoseconds
//! since the previous event of its track (one to three bytes instead of eight). Event
//! names and debug-annotation names are interned per sequence: a name's text is written
//! once per track, in the packet that first uses it. A thread-state or syscall slice
//! costs about 12 bytes per begin or end (`cargo xtask bench --only trace`).
//!
//! Packets go straight to the output, so memory stays flat however long the trace is; the
//! caller must emit each track's events in time order (Perfetto nests slices by time on a
//! track, and a delta cannot be negative). An event earlier than its track's previous one
//! is still written, with an absolute CLOCK_MONOTONIC stamp, and [`read::decode`] reports
//! it.
//!
//! The encodings are Perfetto's own: `ClockSnapshot.Clock.is_incremental` on a clock id in
//! 64..128 (sequence-scoped), `TracePacketDefaults.timestamp_clock_id` and
//! `TrackEventDefaults.track_uuid`; the trace processor resolves them in
//! `ProtoTraceReader::TimestampTokenizeAndPushToSorter` and `ClockSynchronizer`
//! (`ClockDomain::ToNs` adds each delta to the clock's last value, which a snapshot sets).
//!
//! The protobuf types come from a vendored subset of Perfetto's `perfetto_trace.proto`
//! (Apache-2.0, see `NOTICE`), compiled at build time without protoc.

use std::{collections::HashMap, io::Write};

use prost::Message;

pub mod merge;
pub mod read;

/// Generated protobuf types (`perfetto.protos`).
#[allow(missing_docs, clippy::all)]
pub mod pb {
    include!(concat!(env!("OUT_DIR"), "/perfetto.protos.rs"));
}

use pb::{
    debug_annotation, trace_packet, track_event, BuiltinClock, ClockSnapshot, CounterDescriptor,
    DebugAnnotation, DebugAnnotationName, EventName, InternedData, ProcessDescriptor,
    ThreadDescriptor, TracePacket, TracePacketDefaults, TrackDescriptor, TrackEvent,
    TrackEventDefaults,
};

/// The sequence of the clock snapshot and the track descriptors; tracks' sequences follow.
const FIRST_SEQUENCE: u32 = 1;
const SEQ_INCREMENTAL_STATE_CLEARED: u32 = 1;
const SEQ_NEEDS_INCREMENTAL_STATE: u32 = 2;
/// Each track sequence's incremental clock (ids 64..128 are scoped to their sequence).
const TRACK_CLOCK: u32 = 64;

/// Clock readings taken together at the start of a trace, recorded in it so that
/// CLOCK_MONOTONIC stamps (the trace's clock) convert to boot time and wall time.
#[derive(Debug, Clone, Copy)]
pub struct ClockReadings {
    /// CLOCK_MONOTONIC, ns.
    pub monotonic_ns: u64,
    /// CLOCK_BOOTTIME, ns.
    pub boottime_ns: u64,
    /// CLOCK_REALTIME, ns since the epoch.
    pub realtime_ns: u64,
}

impl ClockReadings {
    /// Reads the three clocks now (monotonic before and after, to centre it).
    pub fn now() -> ClockReadings {
        let read = sys_util::clock::clock_ns;
        let m0 = read(libc::CLOCK_MONOTONIC);
        let boottime_ns = read(libc::CLOCK_BOOTTIME);
        let realtime_ns = read(libc::CLOCK_REALTIME);
        let m1 = read(libc::CLOCK_MONOTONIC);
        ClockReadings {
            monotonic_ns: m0 + (m1 - m0) / 2,
            boottime_ns,
            realtime_ns,
        }
    }
}

/// A track: its uuid in the trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Track(pub u64);

/// Unit of a counter track.
#[derive(Debug, Clone, Copy)]
pub enum Unit {
    /// A plain number (percent, ratio, ...), with an optional unit name.
    Plain(&'static str),
    /// Nanoseconds.
    TimeNs,
    /// A count.
    Count,
    /// Bytes.
    Bytes,
}

/// A debug annotation's value.
#[derive(Debug, Clone, Copy)]
pub enum Value<'a> {
    /// Signed integer.
    Int(i64),
    /// Unsigned integer.
    Uint(u64),
    /// Floating point.
    Double(f64),
    /// Text.
    Str(&'a str),
    /// Boolean.
    Bool(bool),
}

/// A named argument attached to an event (a Perfetto debug annotation).
#[derive(Debug, Clone, Copy)]
pub struct Arg<'a> {
    /// Name (interned).
    pub name: &'a str,
    /// Value.
    pub value: Value<'a>,
}

impl<'a> Arg<'a> {
    /// Builds an argument.
    pub fn new(name: &'a str, value: Value<'a>) -> Arg<'a> {
        Arg { name, value }
    }
}

/// Optional parts of an event.
#[derive(Debug, Default, Clone, Copy)]
pub struct Extra<'a> {
    /// Debug annotations.
    pub args: &'a [Arg<'a>],
    /// Flows that start at or pass through this event.
    pub flows: &'a [u64],
    /// Flows that end at this event.
    pub terminating_flows: &'a [u64],
}

/// A track's packet sequence: its id, the last stamp of its incremental clock and its
/// interned names.
struct Sequence {
    id: u32,
    last_ts: u64,
    event_names: HashMap<String, u64>,
    annotation_names: HashMap<String, u64>,
}

/// Writes a Perfetto trace to `W` as it goes.
pub struct TraceWriter<W: Write> {
    out: W,
    next_uuid: u64,
    /// Indexed by track uuid (this writer hands them out from 1); `None` until the track's
    /// first event.
    sequences: Vec<Option<Sequence>>,
    next_sequence: u32,
    buf: Vec<u8>,
    bytes: u64,
    events: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Starts a trace: clock snapshot and sequence defaults (CLOCK_MONOTONIC timestamps).
    pub fn new(out: W, clocks: ClockReadings) -> std::io::Result<TraceWriter<W>> {
        let mut w = TraceWriter {
            out,
            next_uuid: 1,
            sequences: Vec::new(),
            next_sequence: FIRST_SEQUENCE + 1,
            buf: Vec::with_capacity(256),
            bytes: 0,
            events: 0,
        };
        let clock = |id: BuiltinClock, ts| pb::clock_snapshot::Clock {
            clock_id: Some(id as u32),
            timestamp: Some(ts),
            ..Default::default()
        };
        w.packet(&TracePacket {
            timestamp: Some(clocks.boottime_ns),
            timestamp_clock_id: Some(BuiltinClock::Boottime as u32),
            data: Some(trace_packet::Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![
                    clock(BuiltinClock::Monotonic, clocks.monotonic_ns),
                    clock(BuiltinClock::Boottime, clocks.boottime_ns),
                    clock(BuiltinClock::Realtime, clocks.realtime_ns),
                ],
                primary_trace_clock: Some(BuiltinClock::Monotonic as i32),
            })),
            optional_trusted_packet_sequence_id: Some(sequence(FIRST_SEQUENCE)),
            first_packet_on_sequence: Some(true),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            trace_packet_defaults: Some(TracePacketDefaults {
                timestamp_clock_id: Some(BuiltinClock::Monotonic as u32),
                track_event_defaults: None,
            }),
            ..Default::default()
        })?;
        Ok(w)
    }

    /// A process track named `name`.
    pub fn process(&mut self, pid: u32, name: &str) -> std::io::Result<Track> {
        self.descriptor(TrackDescriptor {
            process: Some(ProcessDescriptor {
                pid: Some(pid as i32),
                cmdline: Vec::new(),
                process_name: Some(name.to_string()),
            }),
            ..Default::default()
        })
    }

    /// A thread track (the thread's own timeline) named `name`.
    pub fn thread(&mut self, pid: u32, tid: u32, name: &str) -> std::io::Result<Track> {
        self.descriptor(TrackDescriptor {
            thread: Some(ThreadDescriptor {
                pid: Some(pid as i32),
                tid: Some(i64::from(tid)),
                thread_name: Some(name.to_string()),
            }),
            ..Default::default()
        })
    }

    /// A named slice track under `parent` (a process, a thread, or another track).
    pub fn child(&mut self, parent: Track, name: &str) -> std::io::Result<Track> {
        self.descriptor(TrackDescriptor {
            parent_uuid: Some(parent.0),
            name: Some(name.to_string()),
            ..Default::default()
        })
    }

    /// A counter track under `parent` (or at the top level).
    pub fn counter(
        &mut self,
        parent: Option<Track>,
        name: &str,
        unit: Unit,
    ) -> std::io::Result<Track> {
        use pb::counter_descriptor::Unit as U;
        let (unit, unit_name) = match unit {
            Unit::Plain(n) => (U::Unspecified, (!n.is_empty()).then(|| n.to_string())),
            Unit::TimeNs => (U::TimeNs, None),
            Unit::Count => (U::Count, None),
            Unit::Bytes => (U::SizeBytes, None),
        };
        self.descriptor(TrackDescriptor {
            parent_uuid: parent.map(|p| p.0),
            name: Some(name.to_string()),
            counter: Some(CounterDescriptor {
                unit: Some(unit as i32),
                unit_multiplier: None,
                unit_name,
            }),
            ..Default::default()
        })
    }

    /// Opens a slice on `track` at `ts` (CLOCK_MONOTONIC ns).
    pub fn begin(
        &mut self,
        track: Track,
        ts: u64,
        name: &str,
        extra: Extra<'_>,
    ) -> std::io::Result<()> {
        self.event(track, ts, track_event::Type::SliceBegin, Some(name), extra)
    }

    /// Closes the innermost open slice on `track`.
    pub fn end(&mut self, track: Track, ts: u64) -> std::io::Result<()> {
        self.event(
            track,
            ts,
            track_event::Type::SliceEnd,
            None,
            Extra::default(),
        )
    }

    /// An instant event on `track`.
    pub fn instant(
        &mut self,
        track: Track,
        ts: u64,
        name: &str,
        extra: Extra<'_>,
    ) -> std::io::Result<()> {
        self.event(track, ts, track_event::Type::Instant, Some(name), extra)
    }

    /// A counter value on a counter track.
    pub fn count(&mut self, track: Track, ts: u64, value: f64) -> std::io::Result<()> {
        self.events += 1;
        let seq = self.sequence(track, ts)?;
        self.plain(seq, ts, track_event::Type::Counter, None, Some(value))
    }

    /// Track events written so far (slice begins and ends, instants, counter values).
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Bytes written so far.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Flushes and returns the output.
    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn descriptor(&mut self, mut d: TrackDescriptor) -> std::io::Result<Track> {
        let track = Track(self.next_uuid);
        self.next_uuid += 1;
        d.uuid = Some(track.0);
        self.packet(&TracePacket {
            data: Some(trace_packet::Data::TrackDescriptor(d)),
            optional_trusted_packet_sequence_id: Some(sequence(FIRST_SEQUENCE)),
            ..Default::default()
        })?;
        Ok(track)
    }

    /// The index of `track`'s sequence, opening it at `ts` if this is its first event: a
    /// packet that clears the sequence's state, sets its defaults (the track, the incremental
    /// clock) and snapshots that clock against CLOCK_MONOTONIC at `ts`.
    fn sequence(&mut self, track: Track, ts: u64) -> std::io::Result<usize> {
        if track.0 == 0 || track.0 >= self.next_uuid {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("track {} was not defined by this writer", track.0),
            ));
        }
        let i = track.0 as usize;
        if i >= self.sequences.len() {
            self.sequences.resize_with(i + 1, || None);
        }
        if self.sequences[i].is_some() {
            return Ok(i);
        }
        let id = self.next_sequence;
        self.next_sequence += 1;
        let clock = |clock_id, is_incremental| pb::clock_snapshot::Clock {
            clock_id: Some(clock_id),
            timestamp: Some(ts),
            is_incremental,
            unit_multiplier_ns: None,
        };
        self.packet(&TracePacket {
            data: Some(trace_packet::Data::ClockSnapshot(ClockSnapshot {
                clocks: vec![
                    clock(TRACK_CLOCK, Some(true)),
                    clock(BuiltinClock::Monotonic as u32, None),
                ],
                primary_trace_clock: None,
            })),
            optional_trusted_packet_sequence_id: Some(sequence(id)),
            first_packet_on_sequence: Some(true),
            sequence_flags: Some(SEQ_INCREMENTAL_STATE_CLEARED),
            trace_packet_defaults: Some(TracePacketDefaults {
                timestamp_clock_id: Some(TRACK_CLOCK),
                track_event_defaults: Some(TrackEventDefaults {
                    track_uuid: Some(track.0),
                }),
            }),
            ..Default::default()
        })?;
        self.sequences[i] = Some(Sequence {
            id,
            last_ts: ts,
            event_names: HashMap::new(),
            annotation_names: HashMap::new(),
        });
        Ok(i)
    }

    /// Sequence `i`'s id and the stamp of an event at `ts` on it: the delta since the track's
    /// previous event, or, for an event earlier than that, `ts` itself on CLOCK_MONOTONIC
    /// (written as it is so that nothing is lost; the reader reports the disorder).
    fn stamp(&mut self, i: usize, ts: u64) -> (u32, u64, Option<u32>) {
        let seq = self.sequences[i].as_mut().expect("the sequence is open");
        match ts.checked_sub(seq.last_ts) {
            Some(delta) => {
                seq.last_ts = ts;
                (seq.id, delta, None)
            }
            None => (seq.id, ts, Some(BuiltinClock::Monotonic as u32)),
        }
    }

    fn event(
        &mut self,
        track: Track,
        ts: u64,
        kind: track_event::Type,
        name: Option<&str>,
        extra: Extra<'_>,
    ) -> std::io::Result<()> {
        let i = self.sequence(track, ts)?;
        let seq = self.sequences[i].as_mut().expect("the sequence is open");
        let known = name.map(|n| seq.event_names.get(n).copied());
        if extra.args.is_empty()
            && extra.flows.is_empty()
            && extra.terminating_flows.is_empty()
            && known != Some(None)
        {
            self.events += 1;
            return self.plain(i, ts, kind, known.flatten(), None);
        }
        let mut interned = InternedData::default();
        let name_iid = name.map(|n| intern(&mut seq.event_names, n, &mut interned.event_names));
        let debug_annotations = extra
            .args
            .iter()
            .map(|a| DebugAnnotation {
                name_field: Some(debug_annotation::NameField::NameIid(intern(
                    &mut seq.annotation_names,
                    a.name,
                    &mut interned.debug_annotation_names,
                ))),
                value: Some(match a.value {
                    Value::Int(v) => debug_annotation::Value::IntValue(v),
                    Value::Uint(v) => debug_annotation::Value::UintValue(v),
                    Value::Double(v) => debug_annotation::Value::DoubleValue(v),
                    Value::Str(v) => debug_annotation::Value::StringValue(v.to_string()),
                    Value::Bool(v) => debug_annotation::Value::BoolValue(v),
                }),
            })
            .collect();
        let has_interned =
            !interned.event_names.is_empty() || !interned.debug_annotation_names.is_empty();
        let (id, timestamp, timestamp_clock_id) = self.stamp(i, ts);
        self.events += 1;
        self.packet(&TracePacket {
            timestamp: Some(timestamp),
            timestamp_clock_id,
            data: Some(trace_packet::Data::TrackEvent(TrackEvent {
                r#type: Some(kind as i32),
                name_field: name_iid.map(track_event::NameField::NameIid),
                debug_annotations,
                flow_ids: extra.flows.to_vec(),
                terminating_flow_ids: extra.terminating_flows.to_vec(),
                ..Default::default()
            })),
            optional_trusted_packet_sequence_id: Some(sequence(id)),
            interned_data: has_interned.then_some(interned),
            sequence_flags: Some(SEQ_NEEDS_INCREMENTAL_STATE),
            ..Default::default()
        })
    }

    /// The common case written without building a message: a track event with no
    /// annotations, flows or new interned names (a slice end, a slice begin or instant with
    /// a name already interned, a counter value) on sequence `i`. It decodes to the same
    /// `TracePacket` as the general path (a test checks) but for `sequence_flags`: its only
    /// effect is to make a reader skip the packet after a loss of packets on the sequence,
    /// which this writer never causes, and it would cost two bytes of every event.
    fn plain(
        &mut self,
        i: usize,
        ts: u64,
        kind: track_event::Type,
        name_iid: Option<u64>,
        counter: Option<f64>,
    ) -> std::io::Result<()> {
        use prost::encoding::{encode_key, encode_varint, WireType};
        let (id, timestamp, clock) = self.stamp(i, ts);
        let mut event = [0u8; 48];
        let mut e = &mut event[..];
        encode_key(9, WireType::Varint, &mut e);
        encode_varint(kind as u64, &mut e);
        if let Some(iid) = name_iid {
            encode_key(10, WireType::Varint, &mut e);
            encode_varint(iid, &mut e);
        }
        if let Some(v) = counter {
            encode_key(44, WireType::SixtyFourBit, &mut e);
            e[..8].copy_from_slice(&v.to_le_bytes());
            e = &mut e[8..];
        }
        let event_len = 48 - e.len();
        let mut packet = [0u8; 80];
        let mut p = &mut packet[..];
        encode_key(8, WireType::Varint, &mut p);
        encode_varint(timestamp, &mut p);
        encode_key(10, WireType::Varint, &mut p);
        encode_varint(u64::from(id), &mut p);
        encode_key(11, WireType::LengthDelimited, &mut p);
        encode_varint(event_len as u64, &mut p);
        p[..event_len].copy_from_slice(&event[..event_len]);
        p = &mut p[event_len..];
        if let Some(clock) = clock {
            encode_key(58, WireType::Varint, &mut p);
            encode_varint(u64::from(clock), &mut p);
        }
        let packet_len = 80 - p.len();
        self.buf.clear();
        encode_key(1, WireType::LengthDelimited, &mut self.buf);
        encode_varint(packet_len as u64, &mut self.buf);
        self.buf.extend_from_slice(&packet[..packet_len]);
        self.bytes += self.buf.len() as u64;
        self.out.write_all(&self.buf)
    }

    fn packet(&mut self, p: &TracePacket) -> std::io::Result<()> {
        self.buf.clear();
        // Trace.packet is field 1, length-delimited: a Trace is just these back to back.
        prost::encoding::encode_key(1, prost::encoding::WireType::LengthDelimited, &mut self.buf);
        p.encode_length_delimited(&mut self.buf)
            .expect("a Vec grows as needed");
        self.bytes += self.buf.len() as u64;
        self.out.write_all(&self.buf)
    }
}

fn sequence(id: u32) -> trace_packet::OptionalTrustedPacketSequenceId {
    trace_packet::OptionalTrustedPacketSequenceId::TrustedPacketSequenceId(id)
}

/// The iid of `name`, adding it (and its definition for this packet) on first use.
fn intern<T: From<(u64, String)>>(
    table: &mut HashMap<String, u64>,
    name: &str,
    defs: &mut Vec<T>,
) -> u64 {
    if let Some(&iid) = table.get(name) {
        return iid;
    }
    let iid = table.len() as u64 + 1;
    table.insert(name.to_string(), iid);
    defs.push(T::from((iid, name.to_string())));
    iid
}

impl From<(u64, String)> for EventName {
    fn from((iid, name): (u64, String)) -> Self {
        EventName {
            iid: Some(iid),
            name: Some(name),
        }
    }
}

impl From<(u64, String)> for DebugAnnotationName {
    fn from((iid, name): (u64, String)) -> Self {
        DebugAnnotationName {
            iid: Some(iid),
            name: Some(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clocks() -> ClockReadings {
        ClockReadings {
            monotonic_ns: 1_000,
            boottime_ns: 2_000,
            realtime_ns: 3_000,
        }
    }

    #[test]
    fn round_trip_resolves_names_nesting_and_counters() {
        let mut w = TraceWriter::new(Vec::new(), clocks()).unwrap();
        let p = w.process(10, "engine").unwrap();
        let t = w.thread(10, 11, "worker").unwrap();
        let states = w.child(t, "state").unwrap();
        let c = w.counter(Some(p), "cpu", Unit::Plain("%")).unwrap();
        let args = [
            Arg::new("batch", Value::Int(8)),
            Arg::new("stage", Value::Str("decode")),
        ];
        w.begin(
            t,
            100,
            "step",
            Extra {
                args: &args,
                ..Extra::default()
            },
        )
        .unwrap();
        w.begin(t, 110, "forward", Extra::default()).unwrap();
        w.end(t, 150).unwrap();
        w.end(t, 200).unwrap();
        w.begin(t, 210, "step", Extra::default()).unwrap();
        w.end(t, 250).unwrap();
        w.begin(states, 100, "running", Extra::default()).unwrap();
        w.end(states, 300).unwrap();
        w.count(c, 100, 42.5).unwrap();
        assert_eq!(w.events(), 9);
        let bytes = w.finish().unwrap();
        let d = read::decode(&bytes).unwrap();
        assert_eq!(d.slices.len(), 4);
        let forward = d.slices.iter().find(|s| s.name == "forward").unwrap();
        assert_eq!((forward.start, forward.end, forward.depth), (110, 150, 1));
        let step = d
            .slices
            .iter()
            .find(|s| s.name == "step" && s.start == 100)
            .unwrap();
        assert_eq!(step.args["batch"], read::ArgValue::Int(8));
        assert_eq!(step.args["stage"], read::ArgValue::Str("decode".into()));
        assert_eq!(d.counters, vec![(c.0, 100, 42.5)]);
        assert_eq!(d.thread_of(states.0), Some(11));
        assert!(d.clocks.contains(&(3, 1_000)));
        // "step" is interned once: the second step costs no name text.
        let steps = bytes.windows(4).filter(|w| w == b"step").count();
        assert_eq!(steps, 1);
    }

    /// The plain path's bytes decode to the packet the general path builds: the delta
    /// since the track's previous event on its own sequence, no track (the sequence's
    /// default), and an absolute CLOCK_MONOTONIC stamp for an event earlier than the last.
    #[test]
    fn the_plain_path_encodes_what_the_general_path_does() {
        use prost::Message;
        let mut w = TraceWriter::new(Vec::new(), clocks()).unwrap();
        let t = w.thread(1, 2, "t").unwrap();
        let base = u64::MAX / 2;
        let i = w.sequence(t, base).unwrap();
        let id = w.sequences[i].as_ref().unwrap().id;
        for (ts, kind, iid, counter, want_ts, want_clock) in [
            (base, track_event::Type::SliceEnd, None, None, 0, None),
            (
                base + 300,
                track_event::Type::SliceBegin,
                Some(300),
                None,
                300,
                None,
            ),
            (
                base + 20_000_000,
                track_event::Type::Counter,
                None,
                Some(-1.5e300),
                19_999_700,
                None,
            ),
            (
                base - 5,
                track_event::Type::SliceEnd,
                None,
                None,
                base - 5,
                Some(3),
            ),
            (
                base + 20_000_001,
                track_event::Type::SliceEnd,
                None,
                None,
                1,
                None,
            ),
        ] {
            w.plain(i, ts, kind, iid, counter).unwrap();
            let fast = pb::Trace::decode(w.buf.as_slice()).unwrap();
            let want = pb::Trace {
                packet: vec![TracePacket {
                    timestamp: Some(want_ts),
                    timestamp_clock_id: want_clock,
                    data: Some(trace_packet::Data::TrackEvent(TrackEvent {
                        r#type: Some(kind as i32),
                        name_field: iid.map(track_event::NameField::NameIid),
                        counter_value_field: counter
                            .map(track_event::CounterValueField::DoubleCounterValue),
                        ..Default::default()
                    })),
                    optional_trusted_packet_sequence_id: Some(sequence(id)),
                    ..Default::default()
                }],
            };
            assert_eq!(fast, want, "{ts}");
        }
    }

    /// Each track's events ride a sequence of their own, so tracks written one after the
    /// other, each in time order, decode to their absolute stamps; an event one nanosecond
    /// apart from the last costs no more than 12 bytes.
    #[test]
    fn tracks_on_their_own_sequences_decode_to_absolute_stamps() {
        let mut w = TraceWriter::new(Vec::new(), clocks()).unwrap();
        let a = w.thread(1, 1, "a").unwrap();
        let b = w.thread(1, 2, "b").unwrap();
        let c = w.counter(None, "c", Unit::Count).unwrap();
        w.begin(a, 5_000, "x", Extra::default()).unwrap();
        w.end(a, 9_000).unwrap();
        w.begin(b, 1_000, "x", Extra::default()).unwrap();
        w.end(b, 2_000).unwrap();
        w.count(c, 500, 1.0).unwrap();
        w.begin(a, 9_000, "x", Extra::default()).unwrap();
        let before = w.bytes();
        w.end(a, 9_001).unwrap();
        assert!(w.bytes() - before <= 12, "{}", w.bytes() - before);
        let d = read::decode(&w.finish().unwrap()).unwrap();
        let mut spans: Vec<(u64, u64, u64)> =
            d.slices.iter().map(|s| (s.track, s.start, s.end)).collect();
        spans.sort();
        assert_eq!(
            spans,
            vec![
                (a.0, 5_000, 9_000),
                (a.0, 9_000, 9_001),
                (b.0, 1_000, 2_000)
            ]
        );
        assert_eq!(d.counters, vec![(c.0, 500, 1.0)]);
        // The builtin clocks of the first snapshot, not a track's.
        assert!(d.clocks.contains(&(1, 3_000)), "{:?}", d.clocks);
    }

    #[test]
    fn reader_rejects_unclosed_slices_and_time_going_back() {
        let mut w = TraceWriter::new(Vec::new(), clocks()).unwrap();
        let t = w.thread(1, 1, "t").unwrap();
        w.begin(t, 100, "a", Extra::default()).unwrap();
        w.begin(t, 90, "b", Extra::default()).unwrap();
        w.end(t, 95).unwrap();
        let err = read::decode(&w.finish().unwrap()).unwrap_err();
        assert!(err.contains("goes back in time"), "{err}");
        assert!(err.contains("never closed"), "{err}");
    }
}
