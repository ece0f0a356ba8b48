#!/usr/bin/env python3
"""Copies an evaluation's --out directory with each trial's injection labelled from the
injector's call instead of from its stress's onset (inject_from_us moved back by setup_ms), so
that `stallscope evaluate --rescore COPY` scores the same iterations as the evaluation did
before it labelled from the onset.

Usage: labels_from_call.py RUN_DIR COPY_DIR   (RUN_DIR/state/iterations.csv or .csv.gz)
"""
import csv
import gzip
import os
import shutil
import sys


def main(src, dst):
    os.makedirs(os.path.join(dst, "state"), exist_ok=True)
    shutil.copy(os.path.join(src, "scores.json"), dst)
    shutil.copy(os.path.join(src, "state", "evaluate.toml"), os.path.join(dst, "state"))
    its = os.path.join(src, "state", "iterations.csv")
    out = os.path.join(dst, "state", "iterations.csv")
    if os.path.exists(its):
        shutil.copy(its, out)
    else:
        with gzip.open(its + ".gz", "rb") as f, open(out, "wb") as g:
            shutil.copyfileobj(f, g)
    with open(os.path.join(src, "trials.csv")) as f:
        rows = list(csv.DictReader(f))
    if not rows or "setup_ms" not in rows[0]:
        sys.exit("trials.csv has no setup_ms column: the run predates labelling from the onset")
    moved = 0
    for r in rows:
        if r["setup_ms"]:
            r["inject_from_us"] = "%.0f" % (float(r["inject_from_us"]) - float(r["setup_ms"]) * 1e3)
            moved += 1
    with open(os.path.join(dst, "trials.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0].keys()), lineterminator="\n")
        w.writeheader()
        w.writerows(rows)
    print(f"{moved} of {len(rows)} trials labelled from the injector's call in {dst}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
