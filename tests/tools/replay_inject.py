"""Replays recorded runs of the vLLM end-to-end test with slowdowns laid into their steady
windows, and scores an alert rule on them: how many slowdowns it alerts, how soon, and how many
alerts it raises outside them.

Usage: python replay_inject.py STALLSCOPE RUNS_DIR [CONFIG] [--slowdown 1.2,1.5,2]
                               [--steps 40,120] [--every 1200] [--grace 40]

RUNS_DIR holds the daemon's iteration exports (`*.csv.gz`) of runs of tests/sentinel_vllm.rs.
Each run is replayed once as recorded to find its first fit; then, for each slowdown S and
length L, every iteration of L consecutive decode steps starting every --every decode steps
(from 1,000 after the first fit to the end of the 10,000-step steady window) is stretched to S
times its recorded duration, and every later row moves later by the time added, so that time
windows see what an engine that slowed would have shown. These are recorded steps stretched,
not an engine slowed: the engine's own response (queueing, batches changing) is not in them.

Scores, per slowdown and length, over all runs: slowdowns alerted (an alert starting inside
one), the median delay from its first slow step to the alert (ms and steps), the share of slow
steps inside alerts, and false alerts: those starting in the steady window neither inside a
slowdown nor within --grace decode steps after one (the recorded runs' own alerts included).
"""
import bisect
import csv
import gzip
import io
import json
import os
import statistics
import subprocess
import tempfile

from replay_label import command_line

STEADY = 10_000
SKIP = 1_000


def replay(stallscope, rows, fields, config):
    with tempfile.NamedTemporaryFile("w", suffix=".csv") as tmp:
        w = csv.DictWriter(tmp, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
        tmp.flush()
        cmd = [stallscope, "replay", "--csv", tmp.name] + (["--config", config] if config else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def stretch(rows, decode, spans, factor):
    """The rows with the decode steps of each (first, last) index span of `decode` (and the
    rows between them) `factor` times as long, later rows shifted."""
    out, shift = [], 0.0
    inside = set()
    for first, last in spans:
        inside.update(range(decode[first], decode[last] + 1))
    for i, r in enumerate(rows):
        r = dict(r)
        start = float(r["start_ts"]) + shift
        r["start_ts"] = f"{start:.3f}"
        if i in inside:
            d = float(r["duration_us"])
            r["duration_us"] = f"{d * factor:.3f}"
            shift += d * (factor - 1)
        out.append(r)
    return out


def load(stallscope, path, config):
    """A recorded run: its CSV fields and rows, the indices of its decode rows, and the position
    among them of the first decode step after the first fit (from one replay as recorded)."""
    with gzip.open(path, "rt") as f:
        reader = csv.DictReader(io.StringIO(f.read()))
        fields, rows = reader.fieldnames, list(reader)
    decode = [i for i, r in enumerate(rows) if r["stage"] == "decode"]
    fit_row = replay(stallscope, rows, fields, config)["fits"][0]["row"]
    return fields, rows, decode, bisect.bisect_right(decode, fit_row)


def score(stallscope, run, config, factor, steps, every, grace):
    fields, rows, decode, first = run
    spans = [
        (k, k + steps - 1)
        for k in range(first + SKIP, min(first + STEADY, len(decode)) - steps, every)
    ]
    stretched = stretch(rows, decode, spans, factor)
    r = replay(stallscope, stretched, fields, config)
    starts = [float(x["start_ts"]) for x in stretched]
    out = {"slowdowns": len(spans), "alerted": 0, "lag_ms": [], "lag_steps": [], "slow": 0, "slow_in_alerts": 0, "false": 0}
    covered, alerted = set(), set()
    for a in r["alerts"]:
        if a["modelled_before"] >= STEADY:
            continue
        k0 = bisect.bisect_left(decode, a["row"])
        covered.update(range(k0, k0 + max(a.get("iterations", 0), 1)))
        hit = next((s for s in spans if s[0] <= k0 <= s[1]), None)
        if hit is None:
            if not any(s[1] < k0 <= s[1] + grace for s in spans):
                out["false"] += 1
            continue
        if hit not in alerted:
            alerted.add(hit)
            out["alerted"] += 1
            out["lag_ms"].append((starts[a["row"]] - starts[decode[hit[0]]]) / 1e3)
            out["lag_steps"].append(k0 - hit[0])
    for s in spans:
        out["slow"] += steps
        out["slow_in_alerts"] += sum(1 for k in range(s[0], s[1] + 1) if k in covered)
    return out


def main():
    stallscope, runs, config, options = command_line(
        {"--slowdown": "1.2,1.5,2", "--steps": "40,120", "--every": "1200", "--grace": "40"}
    )
    every, grace = int(options["--every"]), int(options["--grace"])
    recorded = [
        load(stallscope, os.path.join(runs, n), config)
        for n in sorted(n for n in os.listdir(runs) if n.endswith(".csv.gz"))
    ]
    print("| slowdown | steps | slowdowns | alerted | delay, median ms (steps) | slow steps in alerts | false alerts |")
    print("|---|---|---|---|---|---|---|")
    for factor in [float(x) for x in options["--slowdown"].split(",")]:
        for steps in [int(x) for x in options["--steps"].split(",")]:
            t = {"slowdowns": 0, "alerted": 0, "lag_ms": [], "lag_steps": [], "slow": 0, "slow_in_alerts": 0, "false": 0}
            for run in recorded:
                o = score(stallscope, run, config, factor, steps, every, grace)
                for k in t:
                    t[k] += o[k]
            lag = f"{statistics.median(t['lag_ms']):.0f} ({statistics.median(t['lag_steps']):.0f})" if t["lag_ms"] else "-"
            print(
                f"| {factor}x | {steps} | {t['slowdowns']} | {100 * t['alerted'] / max(t['slowdowns'], 1):.1f} % | {lag} "
                f"| {100 * t['slow_in_alerts'] / max(t['slow'], 1):.1f} % | {t['false']} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
