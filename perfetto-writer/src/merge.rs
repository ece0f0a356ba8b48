//! Merges traces of several machines into one, each machine a process group of its own, on
//! one wall-clock time line.
//!
//! Each input is decoded and validated ([`crate::read::decode`]); its stamps (its own
//! CLOCK_MONOTONIC) move to wall time by its own clock snapshot (REALTIME − MONOTONIC), so
//! that traces of machines whose monotonic clocks have nothing in common line up as well as
//! their wall clocks agree. The merged trace's clock is that wall time less a base, and its
//! clock snapshot says so, so a viewer shows the machines' wall-clock instants.
//!
//! Every machine becomes one process (pid `(i + 1) << 22`, above any Linux pid), named after
//! it: its threads become that process's threads (tid `(i + 1) << 22 | tid`, named with their
//! original process's id), its process-level and top-level tracks the process's child
//! tracks. Flow ids are kept apart per machine the same way.

use std::{collections::HashMap, io::Write};

use crate::{
    read::{self, ArgValue, Decoded, TrackKind},
    Arg, ClockReadings, Extra, TraceWriter, Track, Unit, Value,
};

/// Bits of a Linux pid or tid (`PID_MAX_LIMIT` is 2^22).
const ID_BITS: u32 = 22;
/// Perfetto's builtin clock ids.
const REALTIME: u32 = 1;
const MONOTONIC: u32 = 3;

/// One machine's trace.
pub struct Part<'a> {
    /// The machine's name (its process's name in the merged trace).
    pub name: &'a str,
    /// The trace's bytes.
    pub trace: &'a [u8],
}

/// What the merge wrote.
#[derive(Debug, Clone, Copy)]
pub struct Merged {
    /// Track events written.
    pub events: u64,
    /// Wall time of the merged trace's zero, ns since the epoch.
    pub base_unix_ns: u64,
}

enum Ev<'a> {
    Begin(&'a read::Slice),
    End,
    Instant(&'a read::Instant),
    Count(f64),
}

/// Writes the merge of `parts` to `out`; an error names the part that is not a valid trace.
pub fn merge<W: Write>(parts: &[Part<'_>], out: W) -> Result<Merged, String> {
    let decoded: Vec<(Decoded, i128)> = parts
        .iter()
        .map(|p| {
            let d = read::decode(p.trace).map_err(|e| format!("{}: {e}", p.name))?;
            let clock = |id| d.clocks.iter().find(|(c, _)| *c == id).map(|c| c.1);
            let (Some(real), Some(mono)) = (clock(REALTIME), clock(MONOTONIC)) else {
                return Err(format!(
                    "{}: the trace has no clock snapshot of REALTIME and MONOTONIC",
                    p.name
                ));
            };
            let offset = i128::from(real) - i128::from(mono);
            Ok((d, offset))
        })
        .collect::<Result<_, String>>()?;
    // The merged trace's zero: a second before the earliest event of any part.
    let earliest = decoded
        .iter()
        .flat_map(|(d, off)| {
            let firsts = d
                .slices
                .iter()
                .map(|s| s.start)
                .chain(d.instants.iter().map(|i| i.ts))
                .chain(d.counters.iter().map(|c| c.1));
            firsts.map(move |t| i128::from(t) + off)
        })
        .min()
        .unwrap_or(0);
    let base = (earliest - 1_000_000_000).max(0);
    let zero = ClockReadings {
        monotonic_ns: 0,
        boottime_ns: 0,
        realtime_ns: base as u64,
    };
    let mut w = TraceWriter::new(out, zero).map_err(|e| e.to_string())?;
    let io = |e: std::io::Error| e.to_string();
    for (i, ((d, offset), part)) in decoded.iter().zip(parts).enumerate() {
        let high = (i as u32 + 1) << ID_BITS;
        let node = w.process(high, part.name).map_err(io)?;
        let mut tracks: HashMap<u64, Track> = HashMap::new();
        let mut uuids: Vec<u64> = d.tracks.keys().copied().collect();
        uuids.sort_unstable();
        for uuid in &uuids {
            map_track(d, *uuid, node, high, &mut w, &mut tracks).map_err(io)?;
        }
        let at = |ts: u64| (i128::from(ts) + offset - base).max(0) as u64;
        let mut events: HashMap<u64, Vec<(u64, u8, usize, Ev)>> = HashMap::new();
        for s in &d.slices {
            let per = events.entry(s.track).or_default();
            // At one instant: ends (deepest first), then begins (outermost first), a
            // zero-length slice's end right after its begin.
            per.push((at(s.start), 1, s.depth * 2, Ev::Begin(s)));
            let end_key = if s.end == s.start {
                (1, s.depth * 2 + 1)
            } else {
                (0, usize::MAX - s.depth)
            };
            per.push((at(s.end), end_key.0, end_key.1, Ev::End));
        }
        for x in &d.instants {
            events
                .entry(x.track)
                .or_default()
                .push((at(x.ts), 2, 0, Ev::Instant(x)));
        }
        for &(track, ts, v) in &d.counters {
            events
                .entry(track)
                .or_default()
                .push((at(ts), 2, 0, Ev::Count(v)));
        }
        let flow = |f: &u64| (u64::from(high) << 32) ^ f;
        for uuid in &uuids {
            let Some(mut evs) = events.remove(uuid) else {
                continue;
            };
            evs.sort_by_key(|e| (e.0, e.1, e.2));
            let track = tracks[uuid];
            for (ts, _, _, ev) in &evs {
                match ev {
                    Ev::Begin(s) => {
                        let args = args_of(&s.args);
                        let flows: Vec<u64> = s.flows.iter().map(flow).collect();
                        let extra = Extra {
                            args: &args,
                            flows: &flows,
                            terminating_flows: &[],
                        };
                        w.begin(track, *ts, &s.name, extra).map_err(io)?;
                    }
                    Ev::End => w.end(track, *ts).map_err(io)?,
                    Ev::Instant(x) => {
                        let args = args_of(&x.args);
                        let extra = Extra {
                            args: &args,
                            ..Extra::default()
                        };
                        w.instant(track, *ts, &x.name, extra).map_err(io)?;
                    }
                    Ev::Count(v) => w.count(track, *ts, *v).map_err(io)?,
                }
            }
        }
    }
    let events = w.events();
    w.finish().map_err(io)?.flush().map_err(io)?;
    Ok(Merged {
        events,
        base_unix_ns: base as u64,
    })
}

/// The merged trace's track for part track `uuid` (and its parents, first).
fn map_track<W: Write>(
    d: &Decoded,
    uuid: u64,
    node: Track,
    high: u32,
    w: &mut TraceWriter<W>,
    tracks: &mut HashMap<u64, Track>,
) -> std::io::Result<Track> {
    if let Some(t) = tracks.get(&uuid) {
        return Ok(*t);
    }
    let info = &d.tracks[&uuid];
    let parent = match info.parent {
        Some(p) if d.tracks.contains_key(&p) => map_track(d, p, node, high, w, tracks)?,
        _ => node,
    };
    let t = match info.kind {
        TrackKind::Process { .. } => node,
        TrackKind::Thread { pid, tid } => {
            w.thread(high, high | tid, &format!("{} [pid {pid}]", info.name))?
        }
        TrackKind::Child => w.child(parent, &info.name)?,
        TrackKind::Counter => w.counter(Some(parent), &info.name, Unit::Plain(""))?,
    };
    tracks.insert(uuid, t);
    Ok(t)
}

fn args_of(args: &std::collections::BTreeMap<String, ArgValue>) -> Vec<Arg<'_>> {
    args.iter()
        .map(|(k, v)| {
            let value = match v {
                ArgValue::Int(x) => Value::Int(*x),
                ArgValue::Uint(x) => Value::Uint(*x),
                ArgValue::Double(x) => Value::Double(*x),
                ArgValue::Str(s) => Value::Str(s),
                ArgValue::Bool(b) => Value::Bool(*b),
            };
            Arg::new(k, value)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A trace of one process whose monotonic clock reads `mono` when the wall clock reads
    /// `real`: a thread with a slice [100, 300) holding [100, 200) and [200, 200), an instant
    /// and a counter.
    fn part(mono: u64, real: u64) -> Vec<u8> {
        let mut w = TraceWriter::new(
            Vec::new(),
            ClockReadings {
                monotonic_ns: mono,
                boottime_ns: mono,
                realtime_ns: real,
            },
        )
        .unwrap();
        let p = w.process(42, "engine").unwrap();
        let t = w.thread(42, 43, "worker").unwrap();
        let c = w.counter(Some(p), "load", Unit::Plain("")).unwrap();
        let args = [Arg::new("n", Value::Int(3))];
        let x = Extra {
            args: &args,
            ..Extra::default()
        };
        w.begin(t, mono + 100, "step", x).unwrap();
        w.begin(t, mono + 100, "inner", Extra::default()).unwrap();
        w.end(t, mono + 200).unwrap();
        w.begin(t, mono + 200, "blip", Extra::default()).unwrap();
        w.end(t, mono + 200).unwrap();
        w.instant(t, mono + 250, "mark", Extra::default()).unwrap();
        w.end(t, mono + 300).unwrap();
        w.count(c, mono + 150, 7.0).unwrap();
        w.finish().unwrap()
    }

    /// Two machines with unrelated monotonic clocks: one process each, their slices nested
    /// as before and placed by wall time (the second's 1 µs after the first's).
    #[test]
    fn machines_become_processes_on_one_wall_clock() {
        let a = part(5_000_000_000, 1_700_000_000_000_000_000);
        let b = part(90_000_000_000, 1_700_000_000_000_001_000);
        let mut out = Vec::new();
        let m = merge(
            &[
                Part {
                    name: "node-a",
                    trace: &a,
                },
                Part {
                    name: "node-b",
                    trace: &b,
                },
            ],
            &mut out,
        )
        .unwrap();
        let d = read::decode(&out).unwrap();
        let processes: Vec<&str> = {
            let mut v: Vec<&str> = d
                .tracks
                .values()
                .filter(|t| matches!(t.kind, TrackKind::Process { .. }))
                .map(|t| t.name.as_str())
                .collect();
            v.sort();
            v
        };
        assert_eq!(processes, ["node-a", "node-b"]);
        let steps: Vec<_> = d.slices.iter().filter(|s| s.name == "step").collect();
        assert_eq!(steps.len(), 2);
        let wall = |s: &read::Slice| s.start + m.base_unix_ns;
        let mut starts: Vec<u64> = steps.iter().map(|s| wall(s)).collect();
        starts.sort();
        assert_eq!(
            starts,
            [1_700_000_000_000_000_100, 1_700_000_000_000_001_100]
        );
        assert!(d
            .slices
            .iter()
            .filter(|s| s.name == "inner" || s.name == "blip")
            .all(|s| s.depth == 1));
        assert!(steps
            .iter()
            .all(|s| s.args.get("n") == Some(&ArgValue::Int(3))));
        assert_eq!(d.instants.len(), 2);
        assert_eq!(d.counters.len(), 2);
        let tids: Vec<u32> = d
            .tracks
            .values()
            .filter_map(|t| match t.kind {
                TrackKind::Thread { tid, .. } => Some(tid),
                _ => None,
            })
            .collect();
        assert!(tids.contains(&((1 << 22) | 43)) && tids.contains(&((2 << 22) | 43)));
    }

    #[test]
    fn a_part_that_is_no_trace_is_named() {
        let e = merge(
            &[Part {
                name: "node-x",
                trace: b"\x0a\xff\xff",
            }],
            Vec::new(),
        )
        .unwrap_err();
        assert!(e.starts_with("node-x: "), "{e}");
    }
}
