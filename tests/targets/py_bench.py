"""Benchmark target for the Python plane's per-call cost.

Prints "ready PID", then forever: "round START_NS F_NS G_NS F_CPU_NS G_CPU_NS" (START_NS on
CLOCK_MONOTONIC): the ns per call of `watched` and of `unwatched` over N calls each (argv[1],
default 200000): the mean by the wall clock, and the median of 10 equal chunks by the thread's
CPU clock. The CPU clock leaves out the time the thread was preempted or its vCPU taken by the
host, which the wall clock counts; the median leaves out a chunk hit by an interrupt or a
cold cache after a switch. With argv[2] "unwatched" the rounds leave `watched` uncalled (its
figures 0). stallscope watches `__main__:watched` between rounds; `unwatched` is never
watched, so its cost shows what watching does to every other call.
"""
import os
import sys
import time

CHUNKS = 10


def watched(x):
    return x + 1


def unwatched(x):
    return x + 1


def chunked(loop, n):
    """(wall ns per call over all n calls, median CPU ns per call of the chunks) of
    `loop(calls)`, run in CHUNKS equal chunks."""
    wall, cpu = time.perf_counter_ns, time.thread_time_ns
    per = n // CHUNKS
    chunks = []
    t0 = wall()
    for _ in range(CHUNKS):
        c0 = cpu()
        loop(per)
        chunks.append(cpu() - c0)
    t1 = wall()
    chunks.sort()
    return (t1 - t0) / (per * CHUNKS), chunks[CHUNKS // 2] / per


# One loop per function, each calling it from its own call site (as the engine's code does).
def call_watched(calls):
    for i in range(calls):
        watched(i)


def call_unwatched(calls):
    for i in range(calls):
        unwatched(i)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200000
    calls_watched = (sys.argv[2] if len(sys.argv) > 2 else "both") != "unwatched"
    print("ready %d" % os.getpid(), flush=True)
    while True:
        start = time.monotonic_ns()
        fw, fc = chunked(call_watched, n) if calls_watched else (0.0, 0.0)
        gw, gc = chunked(call_unwatched, n)
        print("round %d %.2f %.2f %.2f %.2f" % (start, fw, gw, fc, gc), flush=True)


main()
