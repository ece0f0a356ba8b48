"""Decodes a stallscope trace with the PyPI `perfetto` package's bundled perfetto_trace_pb2 (an
independent protobuf decoder) and checks what a viewer relies on: tracks defined before use,
interned names resolved, per-track time order, every slice closed and properly nested.

Usage: python check_perfetto.py TRACE
Prints one JSON object (counts, threads, slice names); exits 1 listing the problems otherwise.
"""
import json
import sys

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


def main(path):
    trace = pb.Trace()
    with open(path, "rb") as f:
        trace.ParseFromString(f.read())
    problems = []
    names, arg_names = {}, {}
    tracks, threads, last_ts, open_slices = {}, [], {}, {}
    slices = counters = instants = 0
    slice_names = {}
    clocks = []
    TE = pb.TrackEvent
    for i, p in enumerate(trace.packet):
        if p.HasField("interned_data"):
            for n in p.interned_data.event_names:
                names[n.iid] = n.name
            for n in p.interned_data.debug_annotation_names:
                arg_names[n.iid] = n.name
        if p.HasField("clock_snapshot"):
            clocks = [(c.clock_id, c.timestamp) for c in p.clock_snapshot.clocks]
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
        if e.track_uuid not in tracks:
            problems.append("packet %d: undefined track %d" % (i, e.track_uuid))
            continue
        if p.timestamp < last_ts.get(e.track_uuid, 0):
            problems.append("packet %d: time goes back on track %d" % (i, e.track_uuid))
        last_ts[e.track_uuid] = p.timestamp
        for a in e.debug_annotations:
            if a.HasField("name_iid") and a.name_iid not in arg_names:
                problems.append("packet %d: unresolved annotation name %d" % (i, a.name_iid))
        name = None
        if e.HasField("name_iid"):
            name = names.get(e.name_iid)
            if name is None:
                problems.append("packet %d: unresolved event name %d" % (i, e.name_iid))
        stack = open_slices.setdefault(e.track_uuid, [])
        if e.type == TE.TYPE_SLICE_BEGIN:
            stack.append((name, p.timestamp))
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
            if not tracks[e.track_uuid].HasField("counter"):
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
