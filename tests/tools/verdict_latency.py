#!/usr/bin/env python3
"""Verdict latency and the loop's phase times of stallscope daemons on a running vLLM engine
under load (`cargo xtask vllm load --concurrency 8 --prompt-tokens 64 --output-tokens 128`).

usage: verdict_latency.py ENGINE_PID OUT.jsonl NAME=BIN [NAME=BIN ...] --rounds N

Each round runs every build once, in turn (the order reverses every other round): the
daemon attaches (`[deep_dive] on_alert = false`, no reference recordings), loads or fits its
model (one state directory for all, so one fit), settles 10 s, then a 40 s window holding a
requested 5 s deep dive 5 s in. `stallscope_verdict_latency_seconds` and
`stallscope_loop_phase_seconds` are differenced over the window: one JSON line per window
to OUT, and a summary line on stdout. Logs and state in /tmp/stallscope-verdict-latency."""
import json, os, re, signal, subprocess, sys, time, urllib.request

engine = int(sys.argv[1]); out = sys.argv[2]
rounds = int(sys.argv[sys.argv.index("--rounds") + 1])
builds = [a.split("=", 1) for a in sys.argv[3:] if "=" in a]
work = "/tmp/stallscope-verdict-latency"
state = work + "/state"; os.makedirs(state, exist_ok=True)
cfg = work + "/cfg.toml"
open(cfg, "w").write('[deep_dive]\non_alert = false\nreference_settle = "1h"\n'
                     '[state]\ndir = "%s"\n' % state)
URL = "http://127.0.0.1:9464"

def scrape():
    txt = urllib.request.urlopen(URL + "/metrics", timeout=5).read().decode()
    h = {}
    for line in txt.splitlines():
        m = re.match(r'(stallscope_(?:verdict_latency|loop_phase)_seconds)_(bucket|sum|count)\{?(.*?)\}? (\S+)$', line)
        if not m: continue
        name, kind, labels, v = m.groups()
        lab = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        key = (name, lab.get("phase", ""))
        d = h.setdefault(key, {"b": {}, "sum": 0, "count": 0})
        if kind == "bucket": d["b"][lab["le"]] = float(v)
        else: d[kind] = float(v)
    return h, txt

def fitted(txt):
    return re.search(r'stallscope_model_state\{[^}]*state="fitted"\} 1', txt) is not None

def diff(a, b):
    r = {}
    for k, d in b.items():
        p = a.get(k, {"b": {}, "sum": 0, "count": 0})
        bs = {le: d["b"][le] - p["b"].get(le, 0) for le in d["b"]}
        les = sorted((float(x) if x != "+Inf" else 1e9, v) for x, v in bs.items())
        n = d["count"] - p["count"]
        q99 = next((le for le, v in les if v >= 0.99 * n), None) if n else None
        top = next((le for le, v in les if v >= n), None) if n else None
        over = n - dict((x, v) for x, v in bs.items()).get("0.0008", n)
        r["%s/%s" % k] = {"n": n, "sum_ms": round((d["sum"] - p["sum"]) * 1e3, 2),
                          "p99_le": q99, "max_le": top, "over_0.8ms": over}
    return r

with open(out, "a") as f:
    for rnd in range(rounds):
        order = builds if rnd % 2 == 0 else builds[::-1]
        for name, binary in order:
            log = open("%s/%s-%d.log" % (work, name, rnd), "w")
            d = subprocess.Popen([binary, "run", "--pid", str(engine), "--config", cfg],
                                 stdout=log, stderr=subprocess.STDOUT)
            try:
                t0 = time.time()
                while True:
                    time.sleep(1)
                    try:
                        _, txt = scrape()
                        if fitted(txt): break
                    except Exception: pass
                    if time.time() - t0 > 300: raise SystemExit("no model after 300 s")
                time.sleep(10)
                h0, _ = scrape()
                time.sleep(5)
                req = urllib.request.Request(URL + "/api/v1/deep-dive", method="POST",
                    data=json.dumps({"duration_s": 5}).encode(),
                    headers={"content-type": "application/json"})
                dd = urllib.request.urlopen(req, timeout=10).read().decode()
                time.sleep(35)
                h1, _ = scrape()
                rec = {"round": rnd, "build": name, "deep_dive": dd[:200], "window": diff(h0, h1)}
                f.write(json.dumps(rec) + "\n"); f.flush()
                w = rec["window"]
                v = w.get("stallscope_verdict_latency_seconds/", {})
                print(rnd, name, "verdicts", v.get("n"), "over0.8ms", v.get("over_0.8ms"), "p99<=", v.get("p99_le"),
                      {k.split("/")[1]: (x["n"], x["sum_ms"], x["max_le"]) for k, x in w.items() if "loop_phase" in k},
                      flush=True)
            finally:
                d.send_signal(signal.SIGTERM)
                try: d.wait(60)
                except subprocess.TimeoutExpired: d.kill(); d.wait()
                time.sleep(3)
