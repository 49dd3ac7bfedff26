#!/usr/bin/env python3
"""Summarizes the int8-vs-f32 forward runs of one folder into summary.json and a table.

Usage: python3 bench/results/quantization/summarize.py bench/results/quantization/<folder>
Reads <folder>/run*/streampool.json (the `streampool bench --scenarios forward` output).
Per (workload, batch): each run's rows/s in f32 and int8, the ratio within each run (the
two dtypes of one run measured minutes apart in one process), and the median ratio.
"""

import collections
import glob
import json
import os
import statistics
import sys

folder = sys.argv[1]
runs = sorted(glob.glob(os.path.join(folder, "run*", "streampool.json")))
points = collections.defaultdict(dict)  # (workload, batch) -> run -> dtype -> rows/s
meta = None
for path in runs:
    j = json.load(open(path))
    meta = meta or {k: j[k] for k in ("device", "cpu_threads", "host")}
    run = os.path.basename(os.path.dirname(path))
    for r in j["results"]:
        if r.get("scenario") != "forward":
            continue
        points[(r["workload"], r["batch"])].setdefault(run, {})[r["dtype"]] = r["throughput_per_s"]
summary = []
print("| tokens | batch | f32 rows/s per run | int8 rows/s per run | int8/f32 per run | median |")
print("|---|---|---|---|---|---|")
for (w, b), per_run in sorted(points.items(), key=lambda kv: (int(kv[0][0][6:]), kv[0][1])):
    f = [per_run[r]["f32"] for r in sorted(per_run)]
    q = [per_run[r]["int8"] for r in sorted(per_run)]
    ratios = [x / y for x, y in zip(q, f)]
    med = statistics.median(ratios)
    summary.append({"workload": w, "batch": b, "f32": f, "int8": q, "ratios": ratios, "median_ratio": med})
    fmt = lambda v: " / ".join(f"{x:.1f}" for x in v)
    print(f"| {w[6:]} | {b} | {fmt(f)} | {fmt(q)} | {' / '.join(f'{r:.2f}x' for r in ratios)} | {med:.2f}x |")
json.dump({"meta": meta, "runs": [os.path.relpath(p, folder) for p in runs], "points": summary},
          open(os.path.join(folder, "summary.json"), "w"), indent=1)
