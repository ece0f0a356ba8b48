"""What sys.monitoring's events, as the Python probe sets them, cost calls of code they do not
watch (CPython 3.12+): a loop of `unwatched(i)` timed with no events, with the global
PY_UNWIND event, with PY_START/PY_RETURN local to another code object, and with both, the
modes alternated over 30 rounds; each round's figure is the median of 20 chunks by the
thread's CPU clock. Prints each mode's change against no events, mean and 95 % CI.

    python3.13 tests/tools/monitoring_cost.py
"""
import statistics as st
import sys
import time


def watched(x):
    return x + 1


def unwatched(x):
    return x + 1


def loop(n):
    for i in range(n):
        unwatched(i)


def measure(chunks=20, n=20000):
    out = []
    for _ in range(chunks):
        c = time.thread_time_ns()
        loop(n)
        out.append((time.thread_time_ns() - c) / n)
    return st.median(out)


def main():
    mon, tool = sys.monitoring, 4
    E = mon.events
    mon.use_tool_id(tool, "monitoring_cost")
    for event in (E.PY_START, E.PY_RETURN, E.PY_UNWIND):
        mon.register_callback(tool, event, lambda *a: None)
    local = E.PY_START | E.PY_RETURN
    modes = {
        "none": (0, 0),
        "global PY_UNWIND": (E.PY_UNWIND, 0),
        "local events on another function": (0, local),
        "both (the probe's)": (E.PY_UNWIND, local),
    }
    results = {k: [] for k in modes}
    measure()
    for r in range(30):
        order = list(modes) if r % 2 == 0 else list(modes)[::-1]
        for k in order:
            global_events, local_events = modes[k]
            mon.set_events(tool, global_events)
            mon.set_local_events(tool, watched.__code__, local_events)
            measure(3)
            results[k].append(measure())
    base = results["none"]
    for k, v in results.items():
        change = [100 * (a / b - 1) for a, b in zip(v, base)]
        half = 1.96 * st.stdev(change) / len(change) ** 0.5
        print("%s %s: %.2f ns per call, %+.2f %% (95 %% CI +-%.2f)"
              % (sys.version.split()[0], k, st.median(v), st.mean(change), half))


if __name__ == "__main__":
    main()
