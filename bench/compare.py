#!/usr/bin/env python3
"""Side-by-side table of `streampool bench` and `bench/torch_baseline.py`, with ratios and
the benchmark's targets marked PASS/FAIL, and the table dtype x length x batch of
MiniLM: ours forward (pre-tokenized), ours end to end, PyTorch forward, sentence-transformers
`encode` fp16, with ratios and MFU. Prints Markdown (paste it into bench/README.md).

Usage: python3 bench/compare.py [DIR]            reads DIR/streampool.json, DIR/pytorch.json
       python3 bench/compare.py --compiled FILE...  ours f16 forward against
                                                  PyTorch eager and torch.compile per point,
                                                  from streampool JSON and torch_baseline.py's
                                                  pytorch.json or pytorch-compiled.jsonl
       python3 bench/compare.py OURS.json TORCH.json
       python3 bench/compare.py --dtypes FILE...  only the dtype table, from any mix of
                                                  streampool JSON (one per dtype or one with
                                                  --dtypes), pytorch.json, and the older
                                                  torch_dtypes.json
Standard library only.
"""
import json
import os
import sys

# MiniLM (all-MiniLM-L6-v2) shape, for the FLOP count (bench/README.md, "FLOPs and MFU").
LAYERS, HIDDEN, INTERMEDIATE = 6, 384, 1536
# NVIDIA H100 SXM5 dense peaks (datasheet, without sparsity), FLOP/s.
PEAK = {"f16": 989.4e12, "bf16": 989.4e12, "tf32": 494.7e12, "f32": 66.9e12}
DTYPES = ["f32", "tf32", "f16", "bf16"]
# Older files spell dtypes as PyTorch does.
DTYPE_NAMES = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "tf32": "tf32", "f32": "f32", "f16": "f16"}


def flops_per_sentence(seq):
    """Matmul FLOPs of one MiniLM forward over `seq` tokens (2 per multiply-add): per layer
    and token, QKV 3*2*H*H, output projection 2*H*H, FFN 2*2*H*I, attention scores Q.K^T
    2*seq*H and weighted sum P.V 2*seq*H. Embeddings, LayerNorm, softmax, GELU, biases and
    pooling are O(seq*H) and left out."""
    per_token = 8 * HIDDEN * HIDDEN + 4 * HIDDEN * INTERMEDIATE + 4 * seq * HIDDEN
    return LAYERS * seq * per_token


def mfu(rate, seq, dtype):
    if rate is None or dtype not in PEAK:
        return None
    return rate * flops_per_sentence(seq) / PEAK[dtype]


def load(path):
    with open(path) as f:
        return json.load(f)


def pick(results, workload, scenario, **kw):
    out = []
    for r in results:
        if r["workload"] != workload or r["scenario"] != scenario:
            continue
        if all(r.get(k) == v for k, v in kw.items()):
            out.append(r)
    return out


def rate(v):
    return "-" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:,.1f}")


def ratio(a, b):
    return "-" if a is None or not b else f"{a / b:.2f}x"


def lat(r):
    if r is None:
        return "-"
    l = r["latency_ms"]
    return f"{l['p50']:.3f} / {l['p99']:.3f}"


def dtype_of(r):
    """A record's compute dtype: its `dtype` field, else the last word of its `model` label
    (`all-MiniLM-L6-v2 f16`; files from before the dtype field), else f32 for PyTorch's
    fp32 baseline records."""
    if r.get("dtype"):
        return DTYPE_NAMES.get(r["dtype"], r["dtype"])
    word = (r.get("model") or "").split(" ")[-1]
    if word in DTYPE_NAMES:
        return DTYPE_NAMES[word]
    return "f32" if r.get("system") == "pytorch" else None


def dtype_points(files):
    """{(kind, dtype, seq, batch): sentences/s} from any mix of the JSON files; kind is
    ours_fwd, ours_e2e, torch_fwd or st_encode. Later files win on a repeated point."""
    pts = {}
    for f in files:
        if "rows" in f:  # torch_dtypes.json (2026-11-23): its own flat rows
            for r in f["rows"]:
                kind = "torch_fwd" if r["what"] == "forward" else "st_encode"
                pts[(kind, DTYPE_NAMES.get(r["dtype"], r["dtype"]), r["seq"], r["batch"])] = r["sentences_per_s"]
            continue
        for r in f.get("results", []):
            w = r.get("workload", "")
            if not w.startswith("minilm"):
                continue
            try:
                seq = int(w[len("minilm"):])
            except ValueError:
                continue
            ours = r.get("system", f.get("system")) == "streampool"
            kind = {("forward", True): "ours_fwd", ("ceiling", True): "ours_e2e",
                    ("forward", False): "torch_fwd", ("ceiling", False): "st_encode"}.get((r["scenario"], ours))
            d = dtype_of(r)
            if kind and d:
                pts[(kind, d, seq, r["batch"])] = r["throughput_per_s"]
    return pts


def pct(v):
    return "-" if v is None else f"{100 * v:.1f}%"


def dtype_table(files, batches=(64, 512)):
    """Prints the dtype x length x batch table and returns the half-precision target checks."""
    pts = dtype_points(files)
    if not any(k[0] in ("ours_fwd", "torch_fwd") for k in pts):
        return []
    seqs = sorted({k[2] for k in pts})
    print("### MiniLM per dtype: sentences/s, ratios and MFU (H100 SXM dense peak)\n")
    print("ours fwd: `streampool bench --scenarios forward` (pre-tokenized: upload ids + forward + "
          "pool + normalize + read-back); ours e2e: `ceiling` (tokenization included); PyTorch fwd: "
          "HF forward with SDPA (+ pool + normalize); ST fp16: sentence-transformers `encode` in "
          "fp16, end to end (the same figure in every dtype row). MFU: matmul FLOPs "
          "(bench/README.md) / time / peak of the row's dtype.\n")
    print("| dtype | tokens | batch | ours fwd | ours e2e | PyTorch fwd | ST fp16 e2e | "
          "fwd / PyTorch | e2e / ST fp16 | MFU ours fwd | MFU PyTorch |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    checks = []
    for d in DTYPES:
        for seq in seqs:
            for b in sorted({k[3] for k in pts if k[2] == seq} | set(batches)):
                get = lambda kind, dt=d: pts.get((kind, dt, seq, b))
                of, oe, tf, st = get("ours_fwd"), get("ours_e2e"), get("torch_fwd"), get("st_encode", "f16")
                if of is None and oe is None and tf is None:
                    continue
                print(f"| {d} | {seq} | {b} | {rate(of)} | {rate(oe)} | {rate(tf)} | {rate(st)} | "
                      f"{ratio(of, tf)} | {ratio(oe, st)} | {pct(mfu(of, seq, d))} | {pct(mfu(tf, seq, d))} |")
                if d == "f16" and of is not None and tf:
                    need = 1.5 if b == 512 else (3.0 if b == 64 else None)
                    if need:
                        checks.append((f"MiniLM f16 forward, {seq} tokens, batch {b}: >= {need:g}x PyTorch "
                                       f"fp16 ({rate(of)} vs {rate(tf)})", of / tf, need))
                if b == 512 and oe is not None and st and d in ("f16", "bf16"):
                    checks.append((f"MiniLM {d} end to end, {seq} tokens, batch 512: >= 3x "
                                   f"sentence-transformers fp16 encode ({rate(oe)} vs {rate(st)})", oe / st, 3.0))
    print()
    missing = [(k, d, s_, b) for d in DTYPES for s_ in seqs for b in batches for k in ("ours_fwd", "torch_fwd")
               if (k, d, s_, b) not in pts]
    if missing:
        print("Missing points (not measured or failed): " +
              ", ".join(f"{k} {d} {s_}x{b}" for k, d, s_, b in missing) + "\n")
    return checks


def print_checks(checks):
    print("### Targets\n")
    print("| target | value | needed | result |")
    print("|---|---:|---:|---|")
    for name, v, need in checks:
        print(f"| {name} | {v:.2f} | {need:g} | {'PASS' if v >= need else 'FAIL'} |")


# Issue 20's targets: ours / the best PyTorch mode, per tokens (None: the mixed workload).
COMPILED_TARGETS = {32: 1.5, 128: 1.3, 256: 1.2, 512: 1.2}


def load_any(path):
    """A JSON report, or a JSON-lines file of records (pytorch-compiled.jsonl)."""
    if path.endswith(".jsonl"):
        with open(path) as f:
            return {"results": [json.loads(l) for l in f if l.strip()], "system": "pytorch"}
    return load(path)


def compiled_table(files, dtype="f16"):
    """ours f16 forward (and, for the mixed workload, our padded path) against PyTorch eager
    and each torch.compile mode, the ratio to the best PyTorch mode per point, and the
    targets against torch.compile. Returns the target checks."""
    ours, torch_modes = {}, {}
    for f in files:
        for r in f.get("results", []):
            w = r.get("workload", "")
            if not w.startswith("minilm") or dtype_of(r) != dtype:
                continue
            key = (w, r["batch"])
            if r.get("system", f.get("system")) == "streampool":
                if r["scenario"] in ("forward", "forward-padded"):
                    ours.setdefault(key, {})[r["scenario"]] = r["throughput_per_s"]
            elif r["scenario"] == "compiled":
                torch_modes.setdefault(key, {})[r["mode"]] = r["throughput_per_s"]
    if not torch_modes:
        return []
    known = ["eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
    seen = {m for v in torch_modes.values() for m in v}
    rank = lambda m: (known.index(m.split(" ")[0]) if m.split(" ")[0] in known else len(known), m)
    modes = sorted(seen, key=rank)

    def order(k):
        w, b = k
        n = w[len("minilm"):]
        return (1, 0, b) if n == "-mix" else (0, int(n), b)

    print(f"### MiniLM {dtype}: ours against PyTorch eager and torch.compile (sentences/s)\n")
    print("ours: `streampool bench --scenarios forward` (upload ids + forward + pool + normalize + "
          "read-back; minilm-mix: packed, and padded to the longest). PyTorch: the HF forward (sdpa) "
          "+ pool + normalize on inputs already on the GPU, no read-back, one function compiled per "
          "shape (`bench/torch_baseline.py --compile-modes`); minilm-mix padded to the batch's longest.\n")
    print("| workload | batch | ours | ours padded | " + " | ".join(f"torch {m}" for m in modes) +
          " | best torch | ours / best | target |")
    print("|---|---:|---:|---:|" + "---:|" * len(modes) + "---|---:|---|")
    checks = []
    for key in sorted(set(ours) | set(torch_modes), key=order):
        w, b = key
        o = ours.get(key, {})
        t = torch_modes.get(key, {})
        best_mode = max(t, key=t.get) if t else None
        best = t.get(best_mode) if best_mode else None
        fwd, padded = o.get("forward"), o.get("forward-padded")
        n = w[len("minilm"):]
        need = 2.0 if n == "-mix" else COMPILED_TARGETS.get(int(n))
        verdict = "-"
        if need and fwd is not None and best:
            verdict = f"{need:g}x {'PASS' if fwd / best >= need else 'FAIL'}"
            checks.append((f"{w} batch {b}: ours >= {need:g}x the best PyTorch ({best_mode}: "
                           f"{rate(fwd)} vs {rate(best)})", fwd / best, need))
        if n == "-mix" and fwd is not None and padded:
            checks.append((f"{w} batch {b}: packed >= 1.3x our padded ({rate(fwd)} vs {rate(padded)})",
                           fwd / padded, 1.3))
        print(f"| {w} | {b} | {rate(fwd)} | {rate(padded)} | " +
              " | ".join(rate(t.get(m)) for m in modes) +
              f" | {best_mode or '-'} | {ratio(fwd, best)} | {verdict} |")
    print()
    return checks


def main():
    args = sys.argv[1:]
    if args and args[0] == "--compiled":
        missing = [p for p in args[1:] if not os.path.exists(p)]
        if missing:
            print(f"(not found, left out: {', '.join(missing)})\n")
        checks = compiled_table([load_any(p) for p in args[1:] if os.path.exists(p)])
        if checks:
            print_checks(checks)
        return
    if args and args[0] == "--dtypes":
        files = [load(p) for p in args[1:]]
        checks = dtype_table(files)
        if checks:
            print_checks(checks)
        return
    if len(args) == 2:
        ours_path, torch_path = args
    else:
        d = args[0] if args else "bench/results/latest"
        ours_path, torch_path = os.path.join(d, "streampool.json"), os.path.join(d, "pytorch.json")
    ours, theirs = load(ours_path), load(torch_path)
    # The issue-5 tables and targets compare end to end in fp32 on PyTorch's side; the forward
    # points and PyTorch's other dtypes go to the dtype table at the end.
    R = [r for r in ours["results"] if r["scenario"] != "forward"]
    T = [r for r in theirs["results"] if r["scenario"] != "forward" and dtype_of(r) == "f32"]
    print(f"streampool ({ours['date']}) vs PyTorch {theirs.get('versions', {}).get('torch', '?')}"
          f" ({theirs['date']}), device: {ours['device']}\n")
    workloads = []
    for r in R + T:
        if r["workload"] not in workloads and r["workload"] != "ops":
            workloads.append(r["workload"])
    checks = []

    for w in workloads:
        unit = "rows/s" if w == "mlp" else "sentences/s"
        print(f"### {w}: threading (batch 1, {unit})\n")
        print("| threads | streampool | PyTorch | ratio | ours p50 / p99 ms | PyTorch p50 / p99 ms |")
        print("|---:|---:|---:|---:|---:|---:|")
        threads = sorted({r["threads"] for r in pick(R, w, "threading") + pick(T, w, "threading")})
        for t in threads:
            o = next(iter(pick(R, w, "threading", threads=t)), None)
            p = next(iter(pick(T, w, "threading", threads=t)), None)
            ov, pv = (o or {}).get("throughput_per_s"), (p or {}).get("throughput_per_s")
            err = f" ({p['errors']} errors)" if p and p.get("errors") else ""
            print(f"| {t} | {rate(ov)} | {rate(pv)}{err} | {ratio(ov, pv)} | {lat(o)} | {lat(p)} |")
        print()
        print(f"### {w}: pre-formed batches, one thread ({unit}; PyTorch: "
              f"{'eager batched run' if w == 'mlp' else 'sentence-transformers encode'})\n")
        print("| batch | streampool | PyTorch | ratio | ours p50 ms | PyTorch p50 ms |")
        print("|---:|---:|---:|---:|---:|---:|")
        batches = sorted({r["batch"] for r in pick(R, w, "ceiling") + pick(T, w, "ceiling")})
        for b in batches:
            o = next(iter(pick(R, w, "ceiling", batch=b)), None)
            p = next(iter(pick(T, w, "ceiling", batch=b)), None)
            ov, pv = (o or {}).get("throughput_per_s"), (p or {}).get("throughput_per_s")
            print(f"| {b} | {rate(ov)} | {rate(pv)} | {ratio(ov, pv)} | "
                  f"{'-' if o is None else format(o['latency_ms']['p50'], '.3f')} | "
                  f"{'-' if p is None else format(p['latency_ms']['p50'], '.3f')} |")
        print()
        bq = pick(R, w, "batching")
        if bq:
            print(f"### {w}: streampool BatchQueue (callers each sending one request at a time)\n")
            print("| callers | max_batch | max_wait ms | mean batch | " + unit +
                  " | % of ceiling | p50 / p99 ms | p99 bound ms |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            for r in bq:
                frac = r.get("ceiling_fraction")
                bound = r.get("p99_bound_ms")
                ok = {True: "ok", False: "over"}.get(r.get("p99_within_bound"), "")
                print(f"| {r['callers']} | {r['batch']} | {r['max_wait_ms']:g} | "
                      f"{r.get('mean_batch_size', 0):.1f} | {rate(r['throughput_per_s'])} | "
                      f"{'-' if frac is None else format(100 * frac, '.0f') + '%'} | {lat(r)} | "
                      f"{'-' if bound is None else format(bound, '.2f')} {ok} |")
            print()

        # Targets.
        if w == "mlp":
            one = next(iter(pick(R, w, "threading", threads=1)), None)
            eight = next(iter(pick(R, w, "threading", threads=8)), None)
            if one and eight:
                v = eight["throughput_per_s"] / one["throughput_per_s"]
                checks.append((f"mlp threading: 8 threads >= 6x 1 thread ({rate(eight['throughput_per_s'])}"
                               f" vs {rate(one['throughput_per_s'])})", v, 6.0))
            ob = max(pick(R, w, "threading"), key=lambda r: r["throughput_per_s"], default=None)
            pb = max(pick(T, w, "threading"), key=lambda r: r["throughput_per_s"], default=None)
            if ob and pb:
                v = ob["throughput_per_s"] / pb["throughput_per_s"]
                checks.append((f"mlp threading: best >= 3x PyTorch's best ({rate(ob['throughput_per_s'])} at "
                               f"{ob['threads']} threads vs {rate(pb['throughput_per_s'])} at {pb['threads']})",
                               v, 3.0))
        if bq:
            most = max(r["callers"] for r in bq)
            cands = [r for r in bq if r["callers"] == most and r.get("ceiling_fraction") is not None]
            if cands:
                # The configuration that meets both targets with the most throughput; if none
                # does, the one closest to the ceiling.
                both = [r for r in cands if r["ceiling_fraction"] >= 0.9 and r.get("p99_within_bound")]
                best = (max(both, key=lambda r: r["throughput_per_s"]) if both
                        else max(cands, key=lambda r: r["ceiling_fraction"]))
                cfg = f"max_batch {best['batch']}, max_wait {best['max_wait_ms']:g} ms"
                checks.append((f"{w} BatchQueue, {most} callers, best config ({cfg}): >= 90% of the "
                               f"ceiling at batch {best['batch']} ({rate(best['throughput_per_s'])} vs "
                               f"{rate(best['ceiling_per_s'])})", best["ceiling_fraction"], 0.9))
                checks.append((f"{w} BatchQueue, {most} callers ({cfg}): p99 {best['latency_ms']['p99']:.2f} ms"
                               f" <= max_wait + 2 batch times ({best['p99_bound_ms']:.2f} ms)",
                               best["p99_bound_ms"] / max(best["latency_ms"]["p99"], 1e-9), 1.0))
        if w.startswith("minilm"):
            ours_best = max((r for r in R if r["workload"] == w and r["scenario"] != "overhead"),
                            key=lambda r: r["throughput_per_s"], default=None)
            st = pick(T, w, "ceiling")
            st_best = max(st, key=lambda r: r["throughput_per_s"], default=None)
            # One sentence at a time: the better of encode(batch 1) and one thread (conservative).
            singles = pick(T, w, "ceiling", batch=1) + pick(T, w, "threading", threads=1)
            st_one = max(singles, key=lambda r: r["throughput_per_s"], default=None)
            if ours_best and st_best:
                checks.append((f"{w}: best embeddings/s >= 2x sentence-transformers' best batch size "
                               f"({rate(ours_best['throughput_per_s'])}, {ours_best['scenario']} batch "
                               f"{ours_best['batch']}, vs {rate(st_best['throughput_per_s'])} at batch "
                               f"{st_best['batch']})", ours_best["throughput_per_s"] / st_best["throughput_per_s"], 2.0))
            if bq and st_one:
                most = max(r["callers"] for r in bq)
                best_q = max((r for r in bq if r["callers"] == most), key=lambda r: r["throughput_per_s"])
                checks.append((f"{w}: BatchQueue with {most} single-sentence callers >= 20x "
                               f"sentence-transformers one sentence at a time ({rate(best_q['throughput_per_s'])}"
                               f" vs {rate(st_one['throughput_per_s'])})",
                               best_q["throughput_per_s"] / st_one["throughput_per_s"], 20.0))

    ops = [r for r in R if r["scenario"] == "overhead"]
    if ops:
        print(f"### overhead (streampool, {ours['device']})\n")
        print("| op | us per op | reference (sgemm, 1 thread) us | ratio |")
        print("|---|---:|---:|---:|")
        for r in ops:
            ref = r.get("reference_us_per_op")
            # On a GPU the sgemm reference is the host CPU's: shown, but it is no target there.
            print(f"| {r['op']} | {r['us_per_op']:.2f} | {'-' if ref is None else format(ref, '.1f')} | "
                  f"{'-' if r.get('ratio') is None else format(r['ratio'], '.3f') + 'x'} |")
        print()

    checks += dtype_table([ours, theirs])
    print_checks(checks)
    print("\n(p99 rows: value = bound / p99, so >= 1 passes.)")


if __name__ == "__main__":
    main()
