"""Replays recorded runs of the vLLM end-to-end test through `stallscope replay` and judges each
alert of the steady window by the engine's own pace.

Usage: python replay_label.py STALLSCOPE RUNS_DIR [CONFIG] [--threshold X|ucl] [--lead N]
                              [--steady N] [--raised-by MS]

RUNS_DIR holds the daemon's iteration exports (`*.csv.gz`) of runs of tests/sentinel_vllm.rs:
a warm-up, 10,000 decode iterations of steady load after the first fit, then a CPU hog. Each is
replayed with CONFIG's [sentinel] settings (default: the embedded default). An alert whose
start comes within the first 10,000 modelled iterations (--steady) is a steady-window alert. It is
explained by the engine's pace when the engine's decode steps over it (and the N before it,
default 14: the window and the persistence that raised it) took on average at least X times their usual
duration, the median of the run's steps of the same batch size and context (in 64-token
bins); `ucl` takes X from the alert's own threshold, 1 / (1 - UCL). With --raised-by MS the
judged steps are instead the iterations that raised the alert: the decode steps that ended in the
MS milliseconds up to the end of the one that opened it; with MS the rule's window (1000 in the
embedded default), as `stallscope evaluate --steady` and the vLLM test judge them. The others are counted as
unexplained: the model's error, not the engine's slowing. Prints a row per run and totals.
"""
import csv
import gzip
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile



def judge(stallscope, path, config, threshold, lead_steps, steady, raised_by_ms=None):
    with gzip.open(path, "rt") as f:
        text = f.read()
    with tempfile.NamedTemporaryFile("w", suffix=".csv") as tmp:
        tmp.write(text)
        tmp.flush()
        cmd = [stallscope, "replay", "--csv", tmp.name] + (["--config", config] if config else [])
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    r = json.loads(out.stdout)
    rows = list(csv.DictReader(io.StringIO(text)))
    decode = [i for i, x in enumerate(rows) if x["stage"] == "decode"]
    key = lambda x: (x["batch_size"], int(float(x["avg_input_length"]) // 64))
    first_fit = r["fits"][0]["row"]
    by_key = {}
    for i in decode:
        if i > first_fit:
            by_key.setdefault(key(rows[i]), []).append(float(rows[i]["duration_us"]))
    usual = {k: statistics.median(v) for k, v in by_key.items() if len(v) >= 5}
    out = {"alerts": 0, "unexplained": 0, "flagged": 0, "unexplained_flagged": 0}
    for a in r["alerts"]:
        if a["modelled_before"] >= steady:
            continue
        n = a.get("iterations", 0)
        if raised_by_ms is None:
            span = [i for i in decode if i >= a["row"]][: max(n, 1)]
            judged = [i for i in decode if i < a["row"]][-lead_steps:] + span
        else:
            end = lambda i: float(rows[i]["start_ts"]) + float(rows[i]["duration_us"])
            to = end(a["row"])
            judged = [i for i in decode if to - raised_by_ms * 1e3 <= end(i) <= to]
        ratios = [float(rows[i]["duration_us"]) / usual[key(rows[i])] for i in judged if key(rows[i]) in usual]
        pace = sum(ratios) / len(ratios) if ratios else 0.0
        limit = 1 / (1 - a["ucl"]) if threshold == "ucl" else float(threshold)
        out["alerts"] += 1
        out["flagged"] += n
        if pace < limit:
            out["unexplained"] += 1
            out["unexplained_flagged"] += n
    hog = [a for a in r["alerts"] if a["modelled_before"] >= steady]
    out["hog_alert_row"] = hog[0]["row"] if hog else None
    out["ucl"] = [round(f["ucl"], 3) for f in r["fits"] if "ucl" in f]
    return out


def command_line(defaults):
    """(stallscope, runs dir, config or None, options): the positional arguments, and each
    `--NAME VALUE` of `defaults` given (or its default)."""
    args, options = [], dict(defaults)
    rest = iter(sys.argv[1:])
    for a in rest:
        if a in options:
            options[a] = next(rest)
        else:
            args.append(a)
    return args[0], args[1], args[2] if len(args) > 2 else None, options


def main():
    stallscope, runs, config, options = command_line(
        {"--threshold": "1.10", "--lead": "14", "--steady": "10000", "--raised-by": None}
    )
    threshold, lead_steps = options["--threshold"], int(options["--lead"])
    raised_by_ms = float(options["--raised-by"]) if options["--raised-by"] else None
    steady = int(options["--steady"])
    total = {"alerts": 0, "unexplained": 0, "flagged": 0, "unexplained_flagged": 0}
    worst, clean, n = 0.0, 0, 0
    print("run alerts unexplained unexplained_flagged_pct hog_alert_row ucl")
    for name in sorted(os.listdir(runs)):
        if not name.endswith(".csv.gz"):
            continue
        o = judge(stallscope, os.path.join(runs, name), config, threshold, lead_steps, steady, raised_by_ms)
        pct = 100 * o["unexplained_flagged"] / steady
        print(name[: -len(".csv.gz")], o["alerts"], o["unexplained"], f"{pct:.2f}", o["hog_alert_row"], o["ucl"])
        for k in total:
            total[k] += o[k]
        worst, clean, n = max(worst, pct), clean + (o["unexplained"] == 0), n + 1
    print(
        f"runs {n}: steady alerts {total['alerts']}, unexplained {total['unexplained']}, "
        f"iterations in unexplained alerts {100 * total['unexplained_flagged'] / (steady * n):.2f} % "
        f"(worst run {worst:.2f} %), runs without an unexplained alert {clean}"
    )


if __name__ == "__main__":
    main()
