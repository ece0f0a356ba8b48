"""Test target for the anomaly injectors: calls Worker.work (about 1 ms of pure Python) in a loop
with a 1 ms sleep, and every 100 ms prints one line:
"<monotonic s> <gen-2 collections> <last work ms> <1 if Worker.work is wrapped by a stall>".

Usage: python py_victim.py   (prints "ready PID" first)
"""
import gc
import os
import sys
import time


class Worker:
    def work(self):
        s = 0
        for i in range(20000):
            s += i
        return s


def main():
    print("ready %d" % os.getpid(), flush=True)
    w = Worker()
    last = time.monotonic()
    while True:
        t = time.monotonic()
        w.work()
        took = time.monotonic() - t
        now = time.monotonic()
        if now - last >= 0.1:
            stalled = hasattr(Worker.__dict__["work"], "__stallscope_orig__")
            print("%.3f %d %.3f %d" % (now, gc.get_stats()[2]["collections"], took * 1e3, stalled), flush=True)
            last = now
        time.sleep(0.001)


if __name__ == "__main__":
    sys.exit(main())
