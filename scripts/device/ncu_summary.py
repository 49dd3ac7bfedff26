#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name.

Usage: ncu_summary.py LOG FORWARDS  (kernel time per forward = sum / FORWARDS)
       ncu_summary.py LOG FORWARDS --tail  (only the last FORWARDS forwards: the longest
       period whose last FORWARDS repeats end the kernel-name sequence, so first-use work such
       as cuBLASLt's algorithm timing stays out; run one forward more than FORWARDS)
"""
import csv
import io
import sys


def main():
    text = open(sys.argv[1], errors="replace").read()
    n = float(sys.argv[2])
    start = text.find('"ID"')
    launches = []
    for r in csv.DictReader(io.StringIO(text[start:])):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        v = float(r["Metric Value"].replace(",", ""))
        unit = r.get("Metric Unit", "ns")
        v *= {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(unit, 1e-3)
        launches.append((r["Kernel Name"][:100], v))
    if "--tail" in sys.argv[3:]:
        k, names = int(n), [name for name, _ in launches]
        period = next((p for p in range(len(names) // k, 0, -1)
                       if all(names[-(i + 1) * p:len(names) - i * p] == names[-p:] for i in range(k))), None)
        if period is None:
            sys.exit("no repeating tail of %d forwards" % k)
        print(f"{period} launches per forward (last {k} of {len(launches)} launches' periods)")
        launches = launches[-k * period:]
    rows = {}
    for name, v in launches:
        c, t = rows.get(name, (0, 0.0))
        rows[name] = (c + 1, t + v)
    total = sum(t for _, t in rows.values()) / n
    print(f"kernel time per forward {total/1e3:.3f} ms")
    for name, (c, t) in sorted(rows.items(), key=lambda kv: -kv[1][1]):
        print(f"  {t/n/1e3:8.3f} ms  x{c/n:5.1f}  {name}")


if __name__ == "__main__":
    main()
