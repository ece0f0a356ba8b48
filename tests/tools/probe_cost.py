"""What the Python probe in place costs calls of code it does not watch, without the injection:
the probe (pyframe-tracer/src/probe.py) run in this process the way a pending call runs it
(its globals, an attach request for `watched`, which is never called), and detached, in turn.
A held period's level is compared with the mean of the detached periods on either side, as
`cargo xtask bench --only python-unwatched` does across the injection; each period's level is
the median of 10 rounds, each the median of 10 chunks of `unwatched` calls by the thread's CPU
clock. Prints the mean change and its 95 % CI per writer ("python"; "native" when the compiled
writer's library is given).

    python3.13 tests/tools/probe_cost.py [CYCLES] [path/to/libstallscope_pyprobe.so]
"""
import json
import os
import statistics as st
import struct
import sys
import tempfile
import time

# monitoring_cost.py's loop of `unwatched` calls, timed; `watched` is looked up as __main__:watched.
from monitoring_cost import measure, watched  # noqa: F401

PROBE = os.path.join(os.path.dirname(__file__), "../../pyframe-tracer/src/probe.py")
# The ring's header as pyframe-tracer/src/ring.rs writes it (magic, version, record size,
# lanes, lane capacity; records at 64 KiB).
MAGIC, VERSION, RECORD_SIZE, RECORDS = 0x3152504353_4C5453, 2, 128, 65536
LANES, CAPACITY = 2, 1024


def level(rounds=10):
    return st.median(measure(chunks=10) for _ in range(rounds))


def ring_file():
    fd, path = tempfile.mkstemp(prefix="stallscope-probe-cost-", dir="/dev/shm")
    size = RECORDS + LANES * CAPACITY * RECORD_SIZE
    os.ftruncate(fd, size)
    head = struct.pack("<QIIII", MAGIC, VERSION, RECORD_SIZE, LANES, CAPACITY)
    os.pwrite(fd, head, 0)
    os.pwrite(fd, struct.pack("<QQ", time.monotonic_ns(), 0), 24)
    os.pwrite(fd, struct.pack("<Q", RECORDS), 40)
    os.close(fd)
    return path


SOURCE = compile(open(PROBE).read(), PROBE, "exec")
SEQ = iter(range(1, 1 << 30))


def request(op, ring, native):
    req = {"op": op, "ring": ring, "seq": next(SEQ)}
    if op == "attach":
        spec = {"text": "__main__:watched", "module": "__main__", "qualname": "watched",
                "fields": [], "role": "watch"}
        timing = "sys.monitoring" if sys.version_info >= (3, 12) else "code-swap"
        req.update(lease_ns=30_000_000_000, timing=timing, specs=[spec], profiles=[], native=native)
    exec(SOURCE, {"__name__": "_stallscope_probe", "_REQUEST": json.dumps(req), "_PAGE": (0, 0)})
    probe = sys.modules.get("_stallscope_probe")
    if op == "attach":
        assert probe is not None and probe.probe.watches, "the probe did not attach"
    else:
        assert probe is None, "the probe did not detach"


def ci95(v):
    m = st.mean(v)
    return m, 1.96 * st.stdev(v) / len(v) ** 0.5


def main():
    cycles = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    writers = [("python", None)] + ([("native", sys.argv[2])] if len(sys.argv) > 2 else [])
    ring = ring_file()
    try:
        level()
        for name, native in writers:
            before = level()
            held = []
            for _ in range(cycles):
                request("attach", ring, native)
                h = level()
                request("detach", ring, native)
                after = level()
                held.append((h / ((before + after) / 2) - 1) * 100)
                before = after
            m, w = ci95(held)
            print("%s %s writer: unwatched calls held %+.2f %% (±%.2f), %d cycles, base %.1f ns"
                  % (sys.version.split()[0], name, m, w, cycles, before))
    finally:
        os.unlink(ring)


main()
