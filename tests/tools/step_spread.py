#!/usr/bin/env python3
"""How evenly a scenario's injections slowed the engine's steps, per `stallscope evaluate` run.

Usage: step_spread.py SCENARIO RUN_DIR [RUN_DIR ...]

Each RUN_DIR needs `trials.csv` and `state/iterations.csv` (docs/evaluation keeps it gzipped:
`gunzip -k state/iterations.csv.gz`). For every trial of SCENARIO that the engine measured
1.2-3x slower, the decode iterations inside its injection are taken as their duration over the
baseline's prediction (y / ŷ); per run it prints the medians over those trials of the quartiles
over the median (p25 / p50, p75 / p50) and of the 10th percentile over the trial's measured
slowdown. A stress that slows every step alike gives quartiles near 1 and a 10th percentile near
the slowdown; one that stretches some steps and leaves others gives a low 10th percentile.
"""
import bisect
import csv
import statistics
import sys


def ratios(run):
    """(start, y / ŷ) of every predicted decode iteration, by start."""
    out = []
    with open(run + "/state/iterations.csv") as f:
        for r in csv.DictReader(f):
            if r["stage"] == "decode" and r["predicted_us"]:
                out.append((float(r["start_ts"]), float(r["duration_us"]) / float(r["predicted_us"])))
    return sorted(out)


def main():
    scenario, runs = sys.argv[1], sys.argv[2:]
    for run in runs:
        its = ratios(run)
        starts = [t for t, _ in its]
        rows = []
        with open(run + "/trials.csv") as f:
            for t in csv.DictReader(f):
                if t["scenario"] != scenario or not t["slowdown_step"]:
                    continue
                slowdown = float(t["slowdown_step"])
                if not 1.2 <= slowdown <= 3.0:
                    continue
                a = bisect.bisect_left(starts, float(t["inject_from_us"]))
                b = bisect.bisect_left(starts, float(t["inject_to_us"]))
                r = sorted(x for _, x in its[a:b])
                if len(r) < 8:
                    continue
                q = lambda p: r[int(p * (len(r) - 1))]
                rows.append((q(0.25) / q(0.5), q(0.75) / q(0.5), q(0.1) / slowdown))
        if not rows:
            print(f"{run} {scenario}: no trial 1.2-3x slower")
            continue
        med = [statistics.median(x[i] for x in rows) for i in range(3)]
        print(f"{run} {scenario}: {len(rows)} trials; p25/p50 {med[0]:.2f}, p75/p50 {med[1]:.2f}, "
              f"p10 over the slowdown {med[2]:.2f}")


if __name__ == "__main__":
    main()
