"""Test target for the sentinel: a toy inference engine whose step does pure-Python work proportional to its
batch's size and context, so a competing process on its CPU makes steps measurably slower.

Usage: python py_engine.py
Prints "ready PID" then runs Engine.step forever (5-25 ms per step, then a 0.5 ms sleep); Engine.housekeeping
runs every 10 steps.
"""
import os
import sys
import time


class Batch:
    def __init__(self, n, context):
        self.reqs = list(range(n))
        self.context = context


class Engine:
    def step(self, batch):
        # Work grows with the batch and with the tokens its attention would read.
        work = 20_000 * len(batch.reqs) + 20 * batch.context
        x = 0
        for i in range(work):
            x += i
        return x

    def housekeeping(self):
        return sum(range(1000))


def main():
    print("ready %d" % os.getpid(), flush=True)
    e = Engine()
    step = 0
    while True:
        n = 1 + (step * 7) % 8
        context = n * (64 + (step * 13) % 256)
        e.step(Batch(n, context))
        if step % 10 == 0:
            e.housekeeping()
        # The gap between iterations (a real engine waits on its queues here).
        time.sleep(0.0005)
        step += 1


if __name__ == "__main__":
    sys.exit(main())
