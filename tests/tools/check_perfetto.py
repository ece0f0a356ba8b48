"""Decodes a stallscope trace with the PyPI `perfetto` package's bundled perfetto_trace_pb2 (an
independent protobuf decoder) and checks what a viewer relies on: tracks defined before use,
interned names resolved, per-track time order, every slice closed and properly nested.
Interned names, packet defaults (clock, track) and sequence-scoped clocks (ids 64..127,
incremental or not) are kept per packet sequence, as Perfetto's trace processor keeps them.

Usage: python check_perfetto.py TRACE
Prints one JSON object (counts, threads, slice names); exits 1 listing the problems otherwise.
"""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


MONOTONIC = 3


class Sequence:
    def __init__(self):
        self.names, self.arg_names = {}, {}
        self.clock = self.track = None
        # clock id -> [incremental, value at the snapshot, MONOTONIC then, last value]
        self.clocks = {}

    def monotonic(self, p):
        clock = p.timestamp_clock_id if p.HasField("timestamp_clock_id") else self.clock
        if clock == MONOTONIC:
            return p.timestamp
        c = self.clocks.get(clock)
        if c is None:
            return None
        if c[0]:
            c[3] += p.timestamp
            value = c[3]
        else:
            value = p.timestamp
        return c[2] + value - c[1]


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    problems = []
    sequences = {}
    tracks, threads, last_ts, open_slices = {}, [], {}, {}
    slices = counters = instants = 0
    slice_names = {}
    clocks = []
    TE = pb.TrackEvent
    for i, p in enumerate(trace.packet):
        sid = p.trusted_packet_sequence_id
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            sequences[sid] = Sequence()
        seq = sequences.setdefault(sid, Sequence())
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            seq.clock = d.timestamp_clock_id if d.HasField("timestamp_clock_id") else None
            seq.track = (d.track_event_defaults.track_uuid
                         if d.track_event_defaults.HasField("track_uuid") else None)
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                seq.names[n.iid] = n.name
            for n in p.interned_data.debug_annotation_names:
                seq.arg_names[n.iid] = n.name
        if p.HasField("clock_snapshot"):
            snap = p.clock_snapshot.clocks
            scoped = [c for c in snap if 64 <= c.clock_id < 128]
            if not scoped:
                clocks = [(c.clock_id, c.timestamp) for c in snap]
            else:
                mono = [c.timestamp for c in snap if c.clock_id == MONOTONIC]
                if not mono:
                    problems.append("packet %d: sequence clock without CLOCK_MONOTONIC" % i)
                for c in scoped:
                    seq.clocks[c.clock_id] = [c.is_incremental, c.timestamp, mono[0] if mono else 0,
                                              c.timestamp]
        if p.HasField("track_descriptor"):
            d = p.track_descriptor
            if d.HasField("parent_uuid") and d.parent_uuid not in tracks:
                problems.append("packet %d: undefined parent %d" % (i, d.parent_uuid))
            tracks[d.uuid] = d
            if d.HasField("thread"):
                threads.append({"pid": d.thread.pid, "tid": d.thread.tid, "name": d.thread.thread_name})
        if not p.HasField("track_event"):
            continue
        e = p.track_event
        track = e.track_uuid if e.HasField("track_uuid") else seq.track
        if track not in tracks:
            problems.append("packet %d: undefined track %s" % (i, track))
            continue
        ts = seq.monotonic(p)
        if ts is None:
            problems.append("packet %d: stamp on a clock no snapshot defined" % i)
            continue
        if ts < last_ts.get(track, 0):
            problems.append("packet %d: time goes back on track %d" % (i, track))
        last_ts[track] = ts
        for a in e.debug_annotations:
            if a.HasField("name_iid") and a.name_iid not in seq.arg_names:
                problems.append("packet %d: unresolved annotation name %d" % (i, a.name_iid))
        name = None
        if e.HasField("name_iid"):
            name = seq.names.get(e.name_iid)
            if name is None:
                problems.append("packet %d: unresolved event name %d" % (i, e.name_iid))
        stack = open_slices.setdefault(track, [])
        if e.type == TE.TYPE_SLICE_BEGIN:
            stack.append((name, ts))
        elif e.type == TE.TYPE_SLICE_END:
            if not stack:
                problems.append("packet %d: end without begin" % i)
            else:
                n, start = stack.pop()
                slices += 1
                slice_names[n] = slice_names.get(n, 0) + 1
        elif e.type == TE.TYPE_INSTANT:
            instants += 1
        elif e.type == TE.TYPE_COUNTER:
            if not tracks[track].HasField("counter"):
                problems.append("packet %d: counter value on a slice track" % i)
            counters += 1
    for uuid, stack in open_slices.items():
        for n, start in stack:
            problems.append("slice %r on track %d never closed" % (n, uuid))
    if not clocks:
        problems.append("no clock snapshot")
    if problems:
        print("\n".join(problems[:20]), file=sys.stderr)
        return 1
    print(json.dumps({
        "packets": len(trace.packet), "tracks": len(tracks), "slices": slices, "instants": instants,
        "counters": counters, "threads": threads, "slice_names": slice_names, "clocks": clocks,
    }))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
