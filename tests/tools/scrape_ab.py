#!/usr/bin/env python3
"""How long the daemon takes to answer a scrape on a node vLLM saturates, for two builds run in
turn (A B per round). Each window: a fresh daemon (the state directory kept, so its model is
loaded, not fitted again) follows the engine under a steady load of 8 concurrent requests and
a SCHED_FIFO hog spinning a decode step's eighth on CPU 0 at 2/3 duty (what
tests/batch_queue_vllm.rs does); /metrics is read every 200 ms, and a separate process sleeping
10 ms at a time records how late it wakes (any ordinary thread of the host). The scraper runs at
SCHED_FIFO 2 while it scrapes, so that what it measures is the daemon's answer, not its own wait
for a CPU. Per window: the slowest scrape and the latest wake.

Usage (as root, on `cargo xtask vllm up --pipeline-parallel 2` recorded in VLLM_JSON):
    python3 tests/tools/scrape_ab.py VLLM_JSON STALLSCOPE_A STALLSCOPE_B ROUNDS WINDOW_S"""
import json, os, subprocess, sys, tempfile, time, urllib.request

VLLM, BINS, ROUNDS, WIN = sys.argv[1], sys.argv[2:4], int(sys.argv[4]), float(sys.argv[5])
ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
server = json.load(open(VLLM))
state = tempfile.mkdtemp(prefix="stallscope-scrape-ab-")
port = 47111

SLEEPER = """
import sys, time
worst, end = 0.0, time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    a = time.monotonic(); time.sleep(0.01); worst = max(worst, time.monotonic() - a - 0.01)
print(worst)
"""


def config():
    cfg = open(os.path.join(ROOT, "probe-user/config/default.toml")).read()
    for a, b in [('listen = "127.0.0.1:9464"', f'listen = "127.0.0.1:{port}"'),
                 ('dir = "/var/lib/stallscope"', f'dir = "{state}"'),
                 ("warmup_samples = 1000", "warmup_samples = 300"),
                 ("on_alert = true", "on_alert = false")]:
        assert a in cfg, f"the default config changed: {a}"
        cfg = cfg.replace(a, b)
    path = os.path.join(state, "config.toml")
    open(path, "w").write(cfg)
    return path


def get(path, timeout=120):
    t = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
        body = r.read().decode()
    return body, time.monotonic() - t


def window(binary, cfg):
    log = open(os.path.join(state, "daemon.log"), "a")
    daemon = subprocess.Popen([binary, "run", "--config", cfg], stdout=log, stderr=log)
    try:
        while True:
            try:
                engines = json.loads(get("/api/v1/status")[0])["engines"]
                if any(e.get("model_state") == "fitted" for e in engines):
                    break
            except OSError:
                pass
            time.sleep(0.5)
        spin = float(server["sizing"]["decode_step_ms"]) / 8 / 1e3
        hog = subprocess.Popen(["timeout", str(WIN), "chrt", "-f", "1", "taskset", "-c", "0", "python3", "-c",
                                f"import time\nwhile True:\n    t = time.monotonic() + {spin}\n"
                                f"    while time.monotonic() < t: pass\n    time.sleep({spin / 2})\n"])
        sleeper = subprocess.Popen(["python3", "-c", SLEEPER, str(WIN)], stdout=subprocess.PIPE, text=True)
        worst, polls, end = 0.0, 0, time.monotonic() + WIN
        # The scraper at SCHED_FIFO 2, above the hog: the time it measures is the daemon's, not
        # its own wait for a CPU (the sleeper shows that of an ordinary thread).
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(2))
        try:
            while time.monotonic() < end:
                worst = max(worst, get("/metrics")[1])
                polls += 1
                time.sleep(0.2)
        finally:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        late = float(sleeper.communicate()[0])
        hog.wait()
        return worst, late, polls
    finally:
        daemon.terminate()
        daemon.wait(60)


def main():
    cfg = config()
    load = subprocess.Popen([os.path.join(ROOT, "target/release/xtask"), "vllm", "load", "--port",
                             str(server["port"]), "--duration", "3600", "--concurrency", "8", "--seed", "32"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        time.sleep(10)
        print("| round | build | scrapes | slowest scrape (s) | latest 10 ms sleeper wake (s) |")
        print("|---|---|---|---|---|")
        for r in range(1, ROUNDS + 1):
            for name, binary in zip("AB", BINS):
                worst, late, polls = window(binary, cfg)
                print(f"| {r} | {name} | {polls} | {worst:.3f} | {late:.3f} |", flush=True)
    finally:
        load.kill()


main()
