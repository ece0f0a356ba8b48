"""Test target for the Python plane: a loop that calls Sched.run_batch and records its own enter/exit stamps.

Usage: python py_loop.py MODE [THREADS]
  MODE sleep   — each call sleeps 1 ms (the thread is parked in clock_nanosleep most of the time)
  MODE busy    — each call spins ~1 ms in pure Python (no syscalls except the stamp line)
  MODE threads — THREADS worker threads run the sleep loop; the main thread polls them at nice 3
  MODE busy-threads — THREADS worker threads run the busy loop (contending for the GIL); the main thread polls
                    at nice 3
  MODE blocked — the main thread blocks in read() on a pipe until a line arrives on stdin, then runs the sleep loop
  MODE exit-soon — like blocked, but the process exits (status 3) as soon as stallscope's ring for it appears in
                   /dev/shm (an attach is under way, however long stallscope took to start), without ever running
                   the loop; after 60 s in any case

Every call prints: "call THREAD STEP T0 T1 BS TOKENS SEQ RESULT" (CLOCK_MONOTONIC ns, taken inside the function).
Every 100 calls per thread it prints "clean STEP 0|1": 1 when no trace of a probe is present.
"""
import os
import sys
import threading
import time

mono = time.monotonic_ns
out_lock = threading.Lock()


class Batch:
    def __init__(self, n, step):
        self.reqs = list(range(n))
        self.tokens = step * 3
        self.seq_lens = {i: i + step for i in range(n)}


class Sched:
    def run_batch(self, batch, step, mode="sleep"):
        t0 = mono()
        if mode == "busy":
            end = t0 + 1_000_000
            x = 0
            while mono() < end:
                x += 1
        else:
            time.sleep(0.001)
        result = (step * 2654435761 + len(batch.reqs)) % 1000003
        t1 = mono()
        return t0, t1, result


ORIG_CODE = Sched.run_batch.__code__


def clean():
    if "_stallscope_probe" in sys.modules or Sched.run_batch.__code__ is not ORIG_CODE:
        return 0
    if Sched.__dict__["run_batch"].__name__ != "run_batch" or hasattr(Sched.__dict__["run_batch"], "__wrapped__"):
        return 0
    if sys.version_info >= (3, 12) and any(sys.monitoring.get_tool(t) for t in range(6)):
        return 0
    return 1


def loop(thread, mode, stop):
    s = Sched()
    step = 0
    while not stop.is_set():
        n = (step % 7) + 1
        b = Batch(n, step)
        t0, t1, result = s.run_batch(b, thread * 1_000_000 + step, mode)
        line = "call %d %d %d %d %d %d %d %d\n" % (thread, thread * 1_000_000 + step, t0, t1, n, b.tokens,
                                                   sum(b.seq_lens.values()), result)
        if step % 100 == 0:
            line += "clean %d %d\n" % (step, clean())
        with out_lock:
            sys.stdout.write(line)
            sys.stdout.flush()
        step += 1


def main():
    mode = sys.argv[1]
    print("ready %d %d.%d" % (os.getpid(), sys.version_info[0], sys.version_info[1]), flush=True)
    stop = threading.Event()
    if mode in ("sleep", "busy"):
        loop(0, mode, stop)
    elif mode in ("threads", "busy-threads"):
        each = "busy" if mode == "busy-threads" else "sleep"
        workers = [threading.Thread(target=loop, args=(i, each, stop), daemon=True)
                   for i in range(int(sys.argv[2]))]
        for w in workers:
            w.start()
        # The polling thread, the one a remote call borrows, at its own nice value: an attach
        # must leave each thread's scheduling as it found it.
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 3)
        while True:
            time.sleep(0.01)
    elif mode in ("blocked", "exit-soon"):
        r, w = os.pipe()
        if mode == "exit-soon":
            def exit_when_attaching():
                ring = "stallscope-ring-%d-" % os.getpid()
                end = time.monotonic() + 60
                while time.monotonic() < end and not any(f.startswith(ring) for f in os.listdir("/dev/shm")):
                    time.sleep(0.005)
                os._exit(3)
            threading.Thread(target=exit_when_attaching, daemon=True).start()

        def feeder():
            sys.stdin.readline()
            os.write(w, b"x")
        threading.Thread(target=feeder, daemon=True).start()
        os.read(r, 1)
        loop(0, "sleep", stop)


main()
