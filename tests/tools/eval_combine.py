#!/usr/bin/env python3
"""Combines `stallscope evaluate` runs of several seeds (their scores.json) into one Markdown report.

Usage: eval_combine.py OUT.md RUN_DIR [RUN_DIR ...]

Counts (true/false positives and negatives, detected trials, root causes) are summed over the runs and the
figures computed from the sums; each seed's own F1 and FPR are listed beside, so the spread shows.
"""
import csv
import json
import sys


def load(d):
    with open(d + "/scores.json") as f:
        run = json.load(f)
    with open(d + "/trials.csv") as f:
        run["trials"] = list(csv.DictReader(f))
    return run


def slowed_root_causes(run, scenario, expected):
    """(correct, deep dives) over the trials that slowed the engine by the goal, from trials.csv."""
    dives = [t["root_cause"] for t in run["trials"] if t["scenario"] == scenario and t["root_cause"]
             and t["slowdown_step"] and float(t["slowdown_step"]) >= run["goal_slowdown"]]
    return sum(c == expected for c in dives), len(dives)


def ratio(a, b):
    return a / b if b else float("nan")


def figures(c):
    p = ratio(c["tp"], c["tp"] + c["fp"])
    r = ratio(c["tp"], c["tp"] + c["fn_"])
    f1 = ratio(2 * p * r, p + r) if p == p and r == r else float("nan")
    fpr = ratio(c["fp"], c["fp"] + c["tn"])
    return p, r, f1, fpr


def pct(x):
    return "-" if x != x else "%.1f" % (100 * x)


def main():
    out, dirs = sys.argv[1], sys.argv[2:]
    runs = [load(d) for d in dirs]
    seeds = [r["seed"] for r in runs]
    first = runs[0]
    lines = []
    w = lines.append
    w("# Detection on vLLM, seeds %s combined" % ", ".join(map(str, seeds)))
    w("")
    w("%d runs of `stallscope evaluate` (%d trials per scenario each, intensity %s, injections of %s engine steps, "
      "lead %s steps, recovery grace %s steps). Per run: UCL %s; engine decode step %s ms; decode iterations %s."
      % (len(runs), first["trials_per_scenario"], first["intensity"], first["span_steps"], first["lead_steps"],
         first["grace_steps"], ", ".join("%.3f" % r["ucl"] for r in runs),
         ", ".join("%.1f" % r["engine_step_ms"] for r in runs), ", ".join(str(r["decode_iterations"]) for r in runs)))
    w("")
    titles = {
        "all_iterations": "Every trial, every iteration labelled (LatencyPrism's scoring)",
        "with_grace": "Every trial, with the recovery grace",
        "slowed_trials_with_grace": "Trials the engine measured >= %.1fx slower, with the grace (the issue's goal)"
        % first["goal_slowdown"],
    }
    for labelling, title in titles.items():
        w("## " + title)
        w("")
        w("| Strategy | Scenario | Precision % | Recall % | F1 % | FPR % | Detected | Lag (ms) | F1 / FPR % per seed |")
        w("|---|---|---:|---:|---:|---:|---:|---:|---|")
        for strategy in first["scores"][labelling]:
            for scenario in first["scores"][labelling][strategy]:
                cells = [r["scores"][labelling].get(strategy, {}).get(scenario) for r in runs]
                cells = [c for c in cells if c]
                if not cells:
                    continue
                total = {k: sum(c[k] for c in cells) for k in ("tp", "fp", "fn_", "tn", "detected", "trials")}
                lag = ratio(sum(c["lag_ms"] * c["detected"] for c in cells if c["lag_ms"] is not None),
                            sum(c["detected"] for c in cells if c["lag_ms"] is not None))
                p, r, f1, fpr = figures(total)
                per_seed = ", ".join("%s / %s" % (pct(figures(c)[2]), pct(figures(c)[3])) for c in cells)
                w("| %s | %s | %s | %s | %s | %s | %d/%d | %s | %s |" % (
                    strategy, scenario, pct(p), pct(r), pct(f1), pct(fpr), total["detected"], total["trials"],
                    "-" if lag != lag else "%.0f" % lag, per_seed))
        w("")
    w("## Recall by the engine's measured slowdown (trials detected / trials)")
    w("")
    classes = [c["slowdown"] for c in first["recall_by_slowdown"][0]["classes"]]
    w("| Strategy | " + " | ".join(classes) + " |")
    w("|---|" + "---:|" * len(classes))
    for i, row in enumerate(first["recall_by_slowdown"]):
        cells = []
        for j in range(len(classes)):
            d = sum(r["recall_by_slowdown"][i]["classes"][j]["detected"] for r in runs)
            t = sum(r["recall_by_slowdown"][i]["classes"][j]["trials"] for r in runs)
            cells.append("%d/%d" % (d, t))
        w("| %s | %s |" % (row["strategy"], " | ".join(cells)))
    w("")
    w("## Root cause top-1 (a deep dive in each injection)")
    w("")
    w("Scenarios with no expected category (their cause is not a resource) list the top category instead.")
    w("")
    w("| Scenario | expected | correct / deep dives | per seed | when >= %sx slower | per seed | categories named (all seeds) |"
      % first["goal_slowdown"])
    w("|---|---|---:|---|---:|---|---|")
    for i, row in enumerate(first["root_cause_top1"]):
        rows = [r["root_cause_top1"][i] for r in runs]
        named = {}
        for x in rows:
            for c in x["categories"]:
                named[c] = named.get(c, 0) + 1
        named = ", ".join("%s %d" % kv for kv in sorted(named.items(), key=lambda kv: -kv[1]))
        if row["expected"] is None:
            w("| %s | - | - | - | - | - | %s |" % (row["scenario"], named))
            continue
        slowed = [slowed_root_causes(r, row["scenario"], row["expected"]) for r in runs]
        w("| %s | %s | %d/%d | %s | %d/%d | %s | %s |" % (
            row["scenario"], row["expected"], sum(x["correct"] for x in rows), sum(x["deep_dives"] for x in rows),
            ", ".join("%d/%d" % (x["correct"], x["deep_dives"]) for x in rows),
            sum(c for c, _ in slowed), sum(n for _, n in slowed), ", ".join("%d/%d" % x for x in slowed), named))
    w("")
    w("## Calibration: the engine's measured slowdown by intensity (median per bin, per seed)")
    w("")
    w("| Scenario | " + " | ".join("%s-%s" % tuple(b["intensity"]) for b in first["calibration"][0]["bins"])
      + " | max |")
    w("|---|" + "---|" * (len(first["calibration"][0]["bins"]) + 1))
    for i, row in enumerate(first["calibration"]):
        rows = [r["calibration"][i] for r in runs]
        bins = []
        for j in range(len(row["bins"])):
            bins.append(", ".join("-" if x["bins"][j]["median_slowdown"] is None
                                  else "%.2fx" % x["bins"][j]["median_slowdown"] for x in rows))
        w("| %s | %s | %s |" % (row["scenario"], " | ".join(bins),
                                ", ".join("-" if x["max_slowdown"] is None else "%.2fx" % x["max_slowdown"]
                                          for x in rows)))
    w("")
    with open(out, "w") as f:
        f.write("\n".join(lines))


main()
