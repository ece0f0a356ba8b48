#!/usr/bin/env python3
"""The daemon's threads free to run on every CPU (A) against kept off the CPUs vLLM's worker
threads are pinned to (B), in alternated windows of one daemon (its own placement turned off,
`[watch] avoid_pinned_cpus = false`; the arms set from outside). Per window: the pinned
worker threads' run-queue wait (ms per second) and involuntary switches per second, the
daemon's CPU, and the share of samples its loop thread was on a pinned CPU.

Usage (as root, beside `cargo xtask vllm load` on `cargo xtask vllm up`):
    python3 tests/tools/affinity_ab.py STALLSCOPE ROUNDS WINDOW_S
Each round is ABBA or BAAB in turn."""
import glob, json, os, statistics, subprocess, sys, tempfile, time

BIN, ROUNDS, WIN = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])

def comm(p):
    try: return open(p + "/comm").read().strip()
    except OSError: return ""

def pids_by_comm(prefix):
    return [int(os.path.basename(p)) for p in glob.glob("/proc/[0-9]*") if comm(p).startswith(prefix)]

def threads(pid):
    return [int(os.path.basename(t)) for t in glob.glob(f"/proc/{pid}/task/*")]

def schedstat(pid, tid):
    try:
        run, wait, n = open(f"/proc/{pid}/task/{tid}/schedstat").read().split()
        return int(run), int(wait)
    except OSError: return None

def nivcsw(pid, tid):
    try:
        for l in open(f"/proc/{pid}/task/{tid}/status"):
            if l.startswith("nonvoluntary_ctxt_switches"): return int(l.split()[1])
    except OSError: return None

def last_cpu(pid, tid):
    try:
        s = open(f"/proc/{pid}/task/{tid}/stat").read()
        return int(s[s.rindex(")") + 2:].split()[36])
    except (OSError, ValueError, IndexError): return None

workers = pids_by_comm("VLLM::Worker")
cores = pids_by_comm("VLLM::EngineCor")
assert workers and cores, (workers, cores)
allcpus = set(os.sched_getaffinity(0))
pinned = set()
hot = []  # worker threads pinned to a strict subset of the CPUs
for w in workers:
    for t in threads(w):
        a = os.sched_getaffinity(t)
        if a != allcpus:
            pinned |= a
            hot.append((w, t, sorted(a)))
print("worker threads pinned:", len(hot), "free CPUs:", sorted(allcpus - pinned), flush=True)
free = allcpus - pinned
assert free, "every CPU is pinned"

TMP = tempfile.mkdtemp(prefix="stallscope-affinity-")
STATE, LOG, CONFIG = TMP + "/state", TMP + "/daemon.log", TMP + "/config.toml"
with open(CONFIG, "w") as f:
    f.write("[watch]\navoid_pinned_cpus = false\n")
log = open(LOG, "w")
d = subprocess.Popen([BIN, "run", "--listen", "127.0.0.1:9477", "--state-dir", STATE, "--config", CONFIG], stderr=log)
t0 = time.time()
while ": attached (" not in open(LOG).read():
    assert time.time() - t0 < 120, "no attach"
    time.sleep(0.5)
time.sleep(15)

def set_daemon(cpus):
    n = 0
    for t in threads(d.pid):
        try:
            os.sched_setaffinity(t, cpus); n += 1
        except OSError as e:
            pass
    return n

def window(arm):
    if arm == "A":
        # Where the scheduler puts it unbidden (its wakes land on the worker's CPU, seen in
        # every sample): put there, then let free.
        set_daemon(pinned); time.sleep(0.05); set_daemon(allcpus)
    else:
        set_daemon(free)
    time.sleep(1.0)
    before = {(w, t): (schedstat(w, t), nivcsw(w, t)) for (w, t, _) in hot}
    dt = [(t, schedstat(d.pid, t)) for t in threads(d.pid)]
    start = time.time()
    on0 = n = 0
    while time.time() - start < WIN:
        try:
            st = open(f"/proc/{d.pid}/task/{d.pid}/stat").read()
            on0 += int(st[st.rindex(")") + 2:].split()[36] in pinned); n += 1
        except OSError: pass
        time.sleep(0.02)
    el = time.time() - start
    wait = ivc = run = 0
    for (w, t, _) in hot:
        a, b = before[(w, t)], (schedstat(w, t), nivcsw(w, t))
        if a[0] and b[0]:
            run += b[0][0] - a[0][0]; wait += b[0][1] - a[0][1]; ivc += b[1] - a[1]
    dcpu = 0
    for t, s in dt:
        s2 = schedstat(d.pid, t)
        if s and s2: dcpu += s2[0] - s[0]
    return dict(arm=arm, wait_ms_s=wait / 1e6 / el, run_ms_s=run / 1e6 / el, ivcsw_s=ivc / el, daemon_cpu_pct=dcpu / 1e7 / el, loop_on_pinned=on0 / max(n, 1))

res = []
order = "ABBA"
try:
    for r in range(ROUNDS):
        for arm in (order if r % 2 == 0 else order[::-1]):
            w = window(arm); res.append(w); print(json.dumps(w), flush=True)
finally:
    d.terminate(); d.wait()
for arm in "AB":
    v = [w for w in res if w["arm"] == arm]
    print(arm, {k: round(statistics.mean(x[k] for x in v), 3) for k in ("wait_ms_s", "run_ms_s", "ivcsw_s", "daemon_cpu_pct", "loop_on_pinned")})
A = [w["wait_ms_s"] for w in res if w["arm"] == "A"]; B = [w["wait_ms_s"] for w in res if w["arm"] == "B"]
pairs = [a - b for a, b in zip(A, B)]
m = statistics.mean(pairs); s = statistics.stdev(pairs) / len(pairs) ** 0.5 if len(pairs) > 1 else 0
print(f"worker run-queue wait, all CPUs minus kept off: {m:.3f} ms/s (+-{1.96*s:.3f})")
