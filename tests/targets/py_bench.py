"""Benchmark target for the Python plane's per-call cost.

Prints "ready PID", then forever: "round START_NS F_NS G_NS" (START_NS on CLOCK_MONOTONIC) — mean ns per call of `watched` and `unwatched` over
N calls each (argv[1], default 200000). stallscope watches `__main__:watched` between rounds; `unwatched` is
never watched, so its cost shows what watching does to every other call.
"""
import os
import sys
import time


def watched(x):
    return x + 1


def unwatched(x):
    return x + 1


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    print("ready %d" % os.getpid(), flush=True)
    mono = time.perf_counter_ns
    while True:
        start = time.monotonic_ns()
        t0 = mono()
        for i in range(n):
            watched(i)
        t1 = mono()
        for i in range(n):
            unwatched(i)
        t2 = mono()
        print("round %d %.2f %.2f" % (start, (t1 - t0) / n, (t2 - t1) / n), flush=True)


main()
