"""streampool's Python package against sentence-transformers, from N Python threads.

    python bench/python_embedder.py --model DIR [--device cpu|cuda] [--dtype f16]
        [--threads 1,4,16,64] [--seconds 3] [--batch 512] [--st] [--out results.json]

For each implementation (streampool.SentenceEmbedder; with --st also
sentence_transformers.SentenceTransformer, fp16 on CUDA via .half()) and each thread count N:
  single:  N threads each call encode(one sentence) in a loop for --seconds;
  batch:   N threads each call encode(--batch sentences, batch_size=--batch) in a loop.
Throughput = sentences of completed calls / span from the common start to the last call's
end (a call that started inside the window counts whole). Every thread checks the shape of
what it gets. Then the binding's per-call overhead at batch 1: the median time of one
Python encode("...") call against the Rust API's own embed(&[text]) timed in Rust on the
same model (SentenceEmbedder._time_rust), both on one thread.
Writes a JSON file and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import threading
import time

import numpy as np

WORDS = (
    "the a streams device batch python thread model sentence vector embedding query search "
    "document quick brown fox jumps over lazy dog weather today river mountain city people "
    "computer language learning fast safe concurrent memory kernel request answer server"
).split()


def corpus(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 24))) + "." for _ in range(n)]


def run_threads(encode, threads: int, seconds: float, make_input, rows: int) -> dict:
    barrier = threading.Barrier(threads + 1)
    counts = [0] * threads
    ends = [0.0] * threads
    errors: list[BaseException] = []
    state = {}

    def work(k: int) -> None:
        try:
            x = make_input(k)
            barrier.wait()
            stop = state["start"] + seconds
            while True:
                out = encode(x)
                assert out.shape[0] == rows if rows > 1 else out.ndim == 1, out.shape
                counts[k] += rows
                ends[k] = time.perf_counter()
                if ends[k] >= stop:
                    break
        except BaseException as e:  # reported below, never lost
            errors.append(e)

    ts = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    for t in ts:
        t.start()
    state["start"] = time.perf_counter()
    barrier.wait()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]
    span = max(ends) - state["start"]
    return {"sentences": sum(counts), "seconds": span, "sentences_per_s": sum(counts) / span}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", default="1,4,16,64")
    ap.add_argument("--batch-threads", default=None, help="thread counts for batch mode (default: --threads)")
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--st", action="store_true", help="also sentence-transformers")
    ap.add_argument("--overhead-iters", type=int, default=300)
    ap.add_argument("--note", default="")
    ap.add_argument("--out", default="python_embedder.json")
    a = ap.parse_args()
    threads = [int(t) for t in a.threads.split(",")]
    batch_threads = [int(t) for t in (a.batch_threads or a.threads).split(",")]
    texts = corpus(4096)

    import streampool

    impls = {}
    sp = streampool.SentenceEmbedder(a.model, device=a.device, dtype=a.dtype)
    impls["streampool"] = lambda x, bs: sp.encode(x, batch_size=bs)
    dtype = sp.dtype
    if a.st:
        import torch
        from sentence_transformers import SentenceTransformer

        st = SentenceTransformer(a.model, device=a.device)
        if a.device.startswith("cuda") and dtype in ("f16", "bf16"):
            st = st.half() if dtype == "f16" else st.to(torch.bfloat16)
        impls["sentence-transformers"] = lambda x, bs: st.encode(x, batch_size=bs, convert_to_numpy=True)
        # Same model, same inputs: the two must agree.
        e1 = sp.encode(texts[:64]); e2 = st.encode(texts[:64])
        cos = (e1 * e2).sum(1) / np.linalg.norm(e1, axis=1) / np.linalg.norm(e2, axis=1)
        print(f"streampool vs sentence-transformers: min cosine {cos.min():.6f}")

    results = []
    for name, enc in impls.items():
        for x in ([texts[0]], texts[: a.batch]):  # warm-up, both shapes
            enc(x, len(x))
        for n in threads:
            r = run_threads(lambda x: enc(x, 32), n, a.seconds, lambda k: texts[k % len(texts)], 1)
            results.append({"impl": name, "mode": "single", "threads": n, **r})
            print(f"{name:>22} single  {n:3d} threads: {r['sentences_per_s']:10.1f} sentences/s", flush=True)
        for n in batch_threads:
            def make(k):
                off = (k * a.batch) % (len(texts) - a.batch)
                return texts[off : off + a.batch]
            r = run_threads(lambda x: enc(x, a.batch), n, a.seconds, make, a.batch)
            results.append({"impl": name, "mode": f"batch{a.batch}", "threads": n, **r})
            print(f"{name:>22} batch{a.batch} {n:3d} threads: {r['sentences_per_s']:10.1f} sentences/s", flush=True)

    # Per-call overhead at batch 1, one thread: Python encode vs the Rust call, same text.
    text = texts[1]
    for _ in range(20):
        sp.encode(text)
    py_times = []
    for _ in range(a.overhead_iters):
        t0 = time.perf_counter_ns()
        sp.encode(text)
        py_times.append((time.perf_counter_ns() - t0) / 1e3)
    rust_us = [sp._time_rust(text, 20) * 1e6 for _ in range(max(3, a.overhead_iters // 20))]
    overhead = {
        "python_encode_us_median": statistics.median(py_times),
        "rust_embed_us_median": statistics.median(rust_us),
    }
    overhead["added_us"] = overhead["python_encode_us_median"] - overhead["rust_embed_us_median"]

    ratios = {}
    if a.st:
        for r in results:
            if r["impl"] == "streampool":
                o = next(x for x in results if x["impl"] != "streampool" and x["mode"] == r["mode"] and x["threads"] == r["threads"])
                ratios[f"{r['mode']}@{r['threads']}"] = r["sentences_per_s"] / o["sentences_per_s"]

    report = {
        "benchmark": "bench/python_embedder.py",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "note": a.note,
        "model": os.path.abspath(a.model),
        "device": sp.device,
        "dtype": dtype,
        "host": {"cpus": os.cpu_count(), "machine": platform.machine(), "python": platform.python_version()},
        "seconds_per_point": a.seconds,
        "results": results,
        "overhead_batch1": overhead,
        "speedup_vs_sentence_transformers": ratios,
    }
    with open(a.out, "w") as f:
        json.dump(report, f, indent=1)
    print(f"\nbinding overhead at batch 1: python encode {overhead['python_encode_us_median']:.1f} us, "
          f"rust embed {overhead['rust_embed_us_median']:.1f} us, added {overhead['added_us']:.1f} us")
    print(f"\n{'impl':>22} {'mode':>9} {'threads':>7} {'sent/s':>10}")
    for r in results:
        print(f"{r['impl']:>22} {r['mode']:>9} {r['threads']:>7} {r['sentences_per_s']:>10.1f}")
    for k, v in ratios.items():
        print(f"streampool / sentence-transformers {k}: {v:.2f}x")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
