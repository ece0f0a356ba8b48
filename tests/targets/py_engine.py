"""Test target for the sentinel: a toy inference engine whose step does pure-Python work proportional to its
batch's size and context, so a competing process on its CPU makes steps measurably slower.

Usage: python py_engine.py
Prints "ready PID" then runs Engine.step forever (5-25 ms per step, then a 0.5 ms sleep); Engine.housekeeping
runs every 10 steps. With STALLSCOPE_TOY_TIMES=FILE it appends a line per step to FILE: the step's end
(CLOCK_MONOTONIC ns), its wall time (ns) and its work units, the engine's own account of its pace.
"""
import os
import sys
import time


class Batch:
    def __init__(self, n, context):
        self.reqs = list(range(n))
        self.context = context


def work_units(batch):
    # Work grows with the batch and with the tokens its attention would read.
    return 20_000 * len(batch.reqs) + 20 * batch.context


class Engine:
    def step(self, batch):
        work = work_units(batch)
        x = 0
        for i in range(work):
            x += i
        return x

    def housekeeping(self):
        return sum(range(1000))


def main():
    print("ready %d" % os.getpid(), flush=True)
    e = Engine()
    times_path = os.environ.get("STALLSCOPE_TOY_TIMES")
    times = open(times_path, "a") if times_path else None
    step = 0
    while True:
        n = 1 + (step * 7) % 8
        context = n * (64 + (step * 13) % 256)
        batch = Batch(n, context)
        start = time.monotonic_ns()
        e.step(batch)
        if times:
            end = time.monotonic_ns()
            times.write("%d %d %d\n" % (end, end - start, work_units(batch)))
            if step % 50 == 0:
                times.flush()
        if step % 10 == 0:
            e.housekeeping()
        # The gap between iterations (a real engine waits on its queues here).
        time.sleep(0.0005)
        step += 1


if __name__ == "__main__":
    sys.exit(main())
