#!/usr/bin/env python3
"""Issue 24's table: streampool `--device cpu` against PyTorch CPU eager and
sentence-transformers on the same host, from one `streampool bench --device cpu` JSON and one
`bench/torch_baseline.py --device cpu --dtypes f32[,bf16]` JSON (each dtype of ours against
PyTorch's in the same dtype; bf16: weights cast with `.to(torch.bfloat16)`, oneDNN). Prints Markdown with the targets
marked PASS/FAIL:

  forward (pre-tokenized: forward, pooling, read-back) at batch 1 and 64, 32 and 128 tokens:
      ours >= 1.5x PyTorch eager (HF BertModel, sdpa, all cores)
  end to end (text in, vectors out) at batch 64: ours >= 1.5x sentence-transformers `encode`
  concurrency: 16 callers with one sentence each (BatchQueue) >= 80% of our batch-16 forward

Usage: python3 bench/cpu_compare.py OURS.json TORCH.json   (standard library only)
"""
import json
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def best(results, **want):
    """The highest throughput among records matching every key of `want`."""
    hits = [r for r in results if all(r.get(k) == v for k, v in want.items())]
    return max(hits, key=lambda r: r["throughput_per_s"]) if hits else None


def rate(r):
    return r["throughput_per_s"] if r else None


def fmt(x, digits=1):
    return "-" if x is None else f"{x:,.{digits}f}"


def ratio(a, b):
    return a / b if a and b else None


def verdict(x, target):
    if x is None:
        return "n/a"
    return "PASS" if x >= target else "FAIL"


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    ours, torch = load(sys.argv[1]), load(sys.argv[2])
    o, t = ours["results"], torch["results"]
    print(f"Host: {ours.get('host', '?')}; streampool intra-op pool {ours.get('cpu_threads', '?')} "
          f"threads, bf16 path {ours.get('cpu_bf16_path', '?')}; PyTorch {torch.get('versions', {}).get('torch', '?')} with "
          f"{torch.get('versions', {}).get('torch_threads', '?')} threads.\n")
    print("| tokens | what | batch | streampool | PyTorch | ratio | target |")
    print("|---:|---|---:|---:|---:|---:|---|")
    checks = []
    seqs = sorted({int(r["workload"][len("minilm"):]) for r in o if r["workload"].startswith("minilm")})
    for seq in seqs:
        w = f"minilm{seq}"
        dtypes = sorted({r.get("dtype", "f32") for r in o if r["workload"] == w and r["scenario"] == "forward"},
                        key=lambda d: (d != "f32", d))
        for d in dtypes:
            batches = sorted({r["batch"] for r in o if r["workload"] == w and r["scenario"] == "forward"
                              and r.get("dtype", "f32") == d})
            for b in batches:
                us = rate(best(o, workload=w, scenario="forward", batch=b, dtype=d))
                them = rate(best(t, workload=w, scenario="forward", batch=b, dtype=d))
                x = ratio(us, them)
                # The issue's targets are f32's; half precision is reported beside it, with
                # its speed over our own f32 at the same point.
                target = ">= 1.5x" if b in (1, 64) and d == "f32" else ""
                if target:
                    checks.append((f"{seq} tokens forward batch {b}", verdict(x, 1.5)))
                extra = ""
                if d != "f32":
                    f32 = rate(best(o, workload=w, scenario="forward", batch=b, dtype="f32"))
                    extra = f"{fmt(ratio(us, f32), 2)}x our f32"
                print(f"| {seq} | forward {d} vs PyTorch eager {d} | {b} | {fmt(us)} | {fmt(them)} | "
                      f"{fmt(x, 2)}x | {target} {verdict(x, 1.5) if target else extra} |")
        batches = sorted({r["batch"] for r in o if r["workload"] == w and r["scenario"] == "ceiling"
                          and r.get("dtype", "f32") == "f32"})
        for b in batches:
            us = rate(best(o, workload=w, scenario="ceiling", batch=b, dtype="f32"))
            them = rate(best(t, workload=w, scenario="ceiling", batch=b, dtype="f32"))
            x = ratio(us, them)
            target = ">= 1.5x" if b == 64 else ""
            if target:
                checks.append((f"{seq} tokens end to end batch {b}", verdict(x, 1.5)))
            print(f"| {seq} | end to end vs sentence-transformers encode | {b} | {fmt(us)} | "
                  f"{fmt(them)} | {fmt(x, 2)}x | {target} {verdict(x, 1.5) if target else ''} |")
        for r in sorted((r for r in o if r["workload"] == w and r["scenario"] == "threading"),
                        key=lambda r: r["threads"]):
            them = rate(best(t, workload=w, scenario="threading", threads=r["threads"]))
            print(f"| {seq} | {r['threads']} threads, one sentence per call (OS threads: "
                  f"{r.get('os_threads', '?')}) | 1 | {fmt(rate(r))} | {fmt(them)} | "
                  f"{fmt(ratio(rate(r), them), 2)}x | |")
        fwd16 = rate(best(o, workload=w, scenario="forward", batch=16))
        for r in sorted((r for r in o if r["workload"] == w and r["scenario"] == "batching"),
                        key=lambda r: r["callers"]):
            share = ratio(rate(r), fwd16)
            line = f"{r['callers']} callers via BatchQueue (max batch {r['batch']}, OS threads: {r.get('os_threads', '?')})"
            if r["callers"] == 16:
                checks.append((f"{seq} tokens 16 callers vs batch-16 forward", verdict(share, 0.8)))
            print(f"| {seq} | {line} | 1 | {fmt(rate(r))} | our batch-16 forward {fmt(fwd16)} | "
                  f"{fmt(share and share * 100, 0)}% | {'>= 80% ' + verdict(share, 0.8) if r['callers'] == 16 else ''} |")
    print()
    for name, v in checks:
        print(f"- {name}: {v}")


if __name__ == "__main__":
    main()
