#!/usr/bin/env python3
"""PyTorch side of `streampool bench`: the same workloads and scenarios, the same JSON fields.

Workloads and scenarios (system="pytorch"):
  mlp        256-1024-GELU-256, fp32 eager, TF32 off, same shapes as ours (weights differ:
             random; the work per call is the same).
             threading: N Python threads, each on its own CUDA stream, each call uploads one
             host row, runs the MLP and reads the result back (`.cpu()`), as ours does.
             ceiling:   one thread, pre-formed batches of B rows (upload, forward, read back):
             PyTorch's batched run.
  minilm32, minilm128   sentence-transformers (all-MiniLM-L6-v2 from --minilm, loaded with
             model_kwargs={"dtype": torch.float32} so fp16 files are upcast, as ours does),
             sentences of exactly 32/128 tokens built by the same formula as ours.
             ceiling:   `model.encode(sentences, batch_size=B)` with B sentences per call, one
             thread; B=1 is "one sentence at a time", the best of B>=32 is "its best batch size".
             threading: N threads, each on its own CUDA stream, each encoding one sentence.
             A call that raises (the fast tokenizer is not thread-safe: "Already borrowed")
             is counted in `errors` and not in the throughput.

Per compute dtype (--dtypes, default on cuda f32,tf32,f16,bf16; "dtype" on every
record), for the minilm workloads:
  forward    the Hugging Face BertModel (attn_implementation="sdpa", weights cast to the dtype,
             TF32 matmuls on for tf32 only) on a batch tokenized once outside the loop; each
             call uploads the ids and mask (pinned, non-blocking), runs the forward, mean-pools,
             L2-normalizes and reads the embeddings back (`.cpu()`): the counting of
             `streampool bench --scenarios forward`. Batches --forward-batches (64,512).
  ceiling with dtype f16: sentence-transformers `encode` in fp16 end to end (tokenization
             included) at the same batches: what a user who wants speed runs.
--dtype-only runs just these (no MLP, no fp32 sentence-transformers sweep).

torch.compile (--compile-modes eager,default,reduce-overhead[,max-autotune]), scenario
"compiled", one record per mode (field "mode"), dtype --compile-dtype (default f16):
  the HF BertModel (sdpa) and mean-pool + normalize in one function, compiled per shape
  (`dynamic=False`; "eager" is the same function uncompiled; a batch without padding runs
  both without the attention mask, mode label "MODE (no mask)", and with it, label "MODE":
  --mask-variants none|mask|both); the token ids and mask are on
  the GPU before the loop (no upload, no read-back: each call ends with a synchronize), which
  favours PyTorch against ours (which uploads and reads back). Points: --compile-seqs x
  --forward-batches fixed-length batches (workloads minilmN), and with --mix the mixed-length
  workload "minilm-mix": sentence i has mix_lengths()[i] tokens (fixed seed, 8-256 tokens,
  long-tailed; the same formula as `streampool bench`), padded to the batch's longest, as a
  PyTorch user batches them. Each record has "compile_s" (the first call, compile included).
--compiled-only runs just these.

Every point: warm-up, then a fixed window; throughput in rows (MLP rows or sentences) per
second, latency per call in ms (p50/p90/p99, nearest rank).

Usage (on the GPU machine, after ours, in the same call):
  python3 bench/torch_baseline.py --device cuda --minilm .dev/minilm-fp16 --out $OUT
  python3 bench/torch_baseline.py --device cuda --minilm .dev/minilm-fp16 --dtype-only --out $OUT
  (CPU smoke test: --device cpu --quick; --dry-run prints the plan without importing torch)
"""
import argparse
import datetime
import json
import math
import os
import sys
import threading
import time

if "--dry-run" not in sys.argv:
    import torch

# --dtypes names (ours) -> (torch dtype name, TF32 matmuls on).
DTYPES = {"f32": ("float32", False), "tf32": ("float32", True), "f16": ("float16", False),
          "bf16": ("bfloat16", False)}

WORDS = ["the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "in", "park", "with",
         "big", "red", "ball", "today"]
INPUT_POOL = 512
MLP_IN, MLP_HIDDEN = 256, 1024
THREAD_STRIDE = 7919


def sentence(i, seq):
    """Sentence i of exactly `seq` tokens ([CLS] + seq-2 one-token words + [SEP]); the same
    formula as crates/streampool-cli/src/commands/bench/workloads.rs."""
    return " ".join(WORDS[(i * 7 + k * 3 + (i // 16) * k) % len(WORDS)] for k in range(seq - 2))


M64 = (1 << 64) - 1
# The mixed-length workload: lengths in [MIX_MIN, MIX_MAX], long-tailed.
MIX_MIN, MIX_MAX, MIX_SEED = 8, 256, 20


def mix_lengths(n, seed=MIX_SEED):
    """Token counts of the mixed-length workload's sentences 0..n: 8 + floor(249 u^3) with u
    uniform in [0, 1) from the 64-bit LCG of workloads.rs (`values`): median 39 tokens, mean
    70, one in five over 128. The same formula as `mix_lengths` in
    crates/streampool-cli/src/commands/bench/workloads.rs (identical integers: u has 24 bits,
    the product is evaluated in the same order in f64)."""
    s = (seed * 6364136223846793005 + 1442695040888963407) & M64
    out = []
    for _ in range(n):
        s = (s * 6364136223846793005 + 1442695040888963407) & M64
        u = (s >> 40) / float(1 << 24)
        out.append(MIX_MIN + int((MIX_MAX - MIX_MIN + 1) * u * u * u))
    return out


def percentiles(samples_ns):
    if not samples_ns:
        return {"p50": 0.0, "p90": 0.0, "p99": 0.0}
    v = sorted(samples_ns)

    def at(p):
        rank = math.ceil(p / 100 * len(v))
        return v[min(max(rank, 1), len(v)) - 1] / 1e6

    return {"p50": at(50), "p90": at(90), "p99": at(99)}


def closed_loop(threads, warm, window, make_call):
    """make_call(thread) -> call(i). Same counting rule as ours: a call counts when it starts
    after the warm-up and is not the thread's first; a thread stops at the first call start
    past the window once it has a counted call."""
    start = time.perf_counter()
    warm_end, deadline = start + warm, start + warm + window
    lats = [[] for _ in range(threads)]
    last = [deadline] * threads
    errors = [0] * threads
    failure = []

    def worker(t):
        try:
            call = make_call(t)
            i = 0
            while True:
                s = time.perf_counter()
                if s >= deadline and (lats[t] or s >= deadline + 5):
                    break
                try:
                    call(i)
                except RuntimeError as e:  # e.g. "Already borrowed" from a shared tokenizer
                    errors[t] += 1
                    if errors[t] == 1 and t == 0:
                        print(f"    note: a call raised: {e}", file=sys.stderr)
                    i += 1
                    continue
                e = time.perf_counter()
                if s >= warm_end and i > 0:
                    lats[t].append(int((e - s) * 1e9))
                    last[t] = max(last[t], e)
                i += 1
        except Exception as e:  # surfaced after join
            failure.append(e)

    ts = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if failure:
        raise failure[0]
    allv = [x for l in lats for x in l]
    secs = max(last) - warm_end
    return len(allv), secs, percentiles(allv), sum(errors)


def record(dev_name, workload, scenario, rows, calls, secs, lat, **extra):
    r = {
        "system": "pytorch", "device": dev_name, "workload": workload, "scenario": scenario,
        "batch": rows, "throughput_per_s": calls * rows / secs if secs > 0 else 0.0,
        "calls_per_s": calls / secs if secs > 0 else 0.0, "latency_ms": lat, "calls": calls,
        "seconds": secs,
    }
    r.update({k: v for k, v in extra.items() if v is not None})
    return r


def mlp_graph_threading(dev, dev_name, params, host, threads, warm, seconds, log):
    """The MLP as the best PyTorch user would write it for one-row calls (`--mlp-graph`): each
    thread has its own stream and its own CUDA graph of the forward (captured once, in
    thread-local capture mode so other threads keep running), static pinned host buffers and
    `non_blocking` copies, and waits on its own stream only. Scenario `threading-graph`."""
    w1, b1, w2, b2 = params

    def forward(x):
        return torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2

    # Capture (with its warm-up and device-wide synchronize) is serialized: another thread's
    # `torch.cuda.synchronize` during a capture is an error even in thread-local mode.
    setup = threading.Lock()
    for t in threads:
        # No thread runs calls until every thread has captured: a capture is invalidated by
        # work other threads queue meanwhile (seen on the H100 with thread-local mode).
        ready = threading.Barrier(t)

        def make(th):
            torch.set_grad_enabled(False)
            with setup:
                stream = torch.cuda.Stream(device=dev)
                x_pin = torch.empty(1, MLP_IN, pin_memory=True)
                y_pin = torch.empty(1, MLP_IN, pin_memory=True)
                with torch.cuda.stream(stream):
                    x_dev = torch.zeros(1, MLP_IN, device=dev)
                    for _ in range(3):  # warm-up on the capture stream, as PyTorch asks
                        forward(x_dev)
                stream.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, stream=stream, capture_error_mode="thread_local"):
                    y_dev = forward(x_dev)
                stream.synchronize()
            ready.wait()

            def call(i):
                x_pin.copy_(host[(th * THREAD_STRIDE + i) % INPUT_POOL].unsqueeze(0))
                with torch.cuda.stream(stream):
                    x_dev.copy_(x_pin, non_blocking=True)
                    graph.replay()
                    y_pin.copy_(y_dev, non_blocking=True)
                stream.synchronize()
                return y_pin.clone()
            return call
        n, secs, lat, err = closed_loop(t, warm, seconds, make)
        log(record(dev_name, "mlp", "threading-graph", 1, n, secs, lat, threads=t,
                   errors=err or None, note="CUDA graph per thread, pinned non_blocking copies"))


def set_tf32(on):
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on
    torch.set_float32_matmul_precision("high" if on else "highest")


def dtype_points(a, dev, dev_name, gpu, dtypes, seqs, batches, warm, seconds, log):
    """The HF forward per dtype x length x batch, then sentence-transformers `encode` in fp16
    end to end at the same lengths and batches (see the module doc)."""
    from transformers import AutoModel, AutoTokenizer
    from sentence_transformers import SentenceTransformer

    tok = AutoTokenizer.from_pretrained(a.minilm)
    sync = (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None)
    for name in dtypes:
        tdtype, tf32 = DTYPES[name]
        set_tf32(tf32)
        model = AutoModel.from_pretrained(a.minilm, dtype=getattr(torch, tdtype),
                                          attn_implementation="sdpa").to(dev).eval()
        for seq in seqs:
            for b in batches:
                texts = [sentence(i, seq) for i in range(b)]
                enc = tok(texts, padding=True, truncation=True, max_length=seq, return_tensors="pt")
                assert enc["input_ids"].shape[1] == seq, "synthetic sentences must be exactly seq tokens"
                ids, mask = enc["input_ids"], enc["attention_mask"]
                if gpu:
                    ids, mask = ids.pin_memory(), mask.pin_memory()

                def call(_i, ids=ids, mask=mask):
                    with torch.inference_mode():
                        i = ids.to(dev, non_blocking=True)
                        m = mask.to(dev, non_blocking=True)
                        out = model(input_ids=i, attention_mask=m).last_hidden_state
                        w = m.unsqueeze(-1).to(out.dtype)
                        pooled = (out * w).sum(1) / w.sum(1).clamp(min=1e-9)
                        return torch.nn.functional.normalize(pooled.float(), dim=-1).cpu()

                # Three calls before the clock: the first call of a dtype and shape pays for
                # cuDNN/cuBLAS plan selection (a 0.6 s window once caught it: 77 sentences/s).
                for _ in range(3):
                    call(0)
                n, secs, lat, err = closed_loop(1, warm, seconds, lambda t: call)
                log(record(dev_name, f"minilm{seq}", "forward", b, n, secs, lat, threads=1, dtype=name,
                           tokens=seq, model="all-MiniLM-L6-v2 (transformers, sdpa)", errors=err or None))
        del model
        sync()
        if gpu:
            torch.cuda.empty_cache()
    set_tf32(False)
    # What a user who wants speed runs: fp16 on a GPU; on a CPU fp32 (PyTorch's CPU fp16
    # matmuls are slower than fp32 on hosts without AVX512-FP16/AMX).
    st_dtype = "f16" if gpu else "f32"
    st = SentenceTransformer(a.minilm, device=str(dev),
                             model_kwargs={"dtype": getattr(torch, DTYPES[st_dtype][0])})
    st.eval()
    for seq in seqs:
        sents = [sentence(i, seq) for i in range(INPUT_POOL)]
        for b in batches:
            def encode(i, b=b, sents=sents):
                batch = [sents[(i * b + r) % INPUT_POOL] for r in range(b)]
                return st.encode(batch, batch_size=b, convert_to_numpy=True, show_progress_bar=False)

            for _ in range(3):
                encode(0)
            n, secs, lat, err = closed_loop(1, warm, seconds, lambda t, encode=encode: encode)
            log(record(dev_name, f"minilm{seq}", "ceiling", b, n, secs, lat, threads=1, dtype=st_dtype,
                       model=f"all-MiniLM-L6-v2 (sentence-transformers {st_dtype})", errors=err or None))
    del st


def compiled_points(a, dev, dev_name, dtype, modes, seqs, batches, mix, warm, seconds, log):
    """torch.compile'd forward + mean-pool + normalize per mode x shape (see the module doc).
    Inputs live on the GPU; one call is one batch, ended by a synchronize."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(a.minilm)
    tdtype, tf32 = DTYPES[dtype]
    set_tf32(tf32)
    model = AutoModel.from_pretrained(a.minilm, dtype=getattr(torch, tdtype),
                                      attn_implementation="sdpa").to(dev).eval()

    def embed(ids, mask, model_mask):
        out = model(input_ids=ids, attention_mask=model_mask).last_hidden_state
        w = mask.unsqueeze(-1).to(out.dtype)
        pooled = (out * w).sum(1) / w.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    shapes = []  # (workload, batch, texts, padded length)
    for seq in seqs:
        for b in batches:
            shapes.append((f"minilm{seq}", b, [sentence(i, seq) for i in range(b)], seq))
    if mix:
        for b in batches:
            lens = mix_lengths(b)
            shapes.append(("minilm-mix", b, [sentence(i, n) for i, n in enumerate(lens)], max(lens)))
    inputs = {}
    for w, b, texts, seq in shapes:
        enc = tok(texts, padding=True, truncation=True, max_length=max(seq, 8), return_tensors="pt")
        assert enc["input_ids"].shape[1] == seq, f"{w}: padded to {enc['input_ids'].shape[1]}, expected {seq}"
        if w == "minilm-mix":
            got = enc["attention_mask"].sum(1).tolist()
            assert got == mix_lengths(b), "mixed sentences must have exactly their lengths"
        inputs[(w, b)] = (enc["input_ids"].to(dev), enc["attention_mask"].to(dev),
                          int(enc["attention_mask"].sum()))
    # (mode, pass the mask on fixed-length batches), per --mask-variants.
    variants = ([(m, True) for m in modes] if a.mask_variants in ("mask", "both") else []) + \
               ([(m, False) for m in modes] if a.mask_variants in ("none", "both") else [])
    done = set()
    for mode, masked in variants:
        for w, b, _texts, seq in shapes:
            if w == "minilm-mix" and (mode, w, b) in done:
                continue  # always masked: one run per mode
            done.add((mode, w, b))
            ids, mask, tokens = inputs[(w, b)]
            torch._dynamo.reset()
            fn = embed if mode == "eager" else torch.compile(embed, mode=None if mode == "default" else mode,
                                                            dynamic=False)
            step = getattr(torch.compiler, "cudagraph_mark_step_begin", None)

            # A batch without padding may run with no attention mask (the same result as an
            # all-ones mask: HF then builds none). Eager ran about alike either way on the
            # H100, the compiled modes 1.8-20x slower without it (2026-11-24), so both forms
            # are measured (--mask-variants) and the best counts.
            model_mask = mask if (masked or w == "minilm-mix") else None

            def call(_i, fn=fn, ids=ids, mask=mask, model_mask=model_mask):
                with torch.inference_mode():
                    if step is not None and mode in ("reduce-overhead", "max-autotune"):
                        step()
                    fn(ids, mask, model_mask)
                torch.cuda.synchronize(dev)

            try:
                t0 = time.perf_counter()
                call(0)
                compile_s = time.perf_counter() - t0
                # Reduce-overhead records its CUDA graph on the calls after the first.
                for _ in range(3):
                    call(0)
                n, secs, lat, err = closed_loop(1, warm, seconds, lambda t, call=call: call)
            except Exception as e:  # a mode that fails at one shape is reported, not fatal
                print(f"    compiled {mode} {w} batch {b}: FAILED {type(e).__name__}: {e}"[:400],
                      file=sys.stderr, flush=True)
                continue
            # Both forms of a fixed-length batch are measured as separate modes (with the
            # mask, compiled modes ran 1.8-20x faster on the H100, 2026-11-24; without it,
            # eager did): the best of them is PyTorch's figure.
            label = mode if model_mask is not None or w == "minilm-mix" else f"{mode} (no mask)"
            r = record(dev_name, w, "compiled", b, n, secs, lat, threads=1, dtype=dtype, mode=label,
                       tokens=seq, real_tokens=tokens, compile_s=round(compile_s, 2),
                       model_mask=model_mask is not None,
                       model="all-MiniLM-L6-v2 (transformers, sdpa)", errors=err or None)
            log(r)
            # Also line by line, so a run cut short by a time limit keeps its points.
            os.makedirs(a.out, exist_ok=True)
            with open(os.path.join(a.out, "pytorch-compiled.jsonl"), "a") as f:
                f.write(json.dumps(r) + "\n")
    del model
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    set_tf32(False)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--workloads", default="mlp,minilm32,minilm128")
    p.add_argument("--threads", default=None, help="default: cuda 1,2,4,8,16,32,64; cpu 1,2,4")
    p.add_argument("--mlp-batches", default=None, help="default: cuda 1,16,64; cpu 1,8")
    p.add_argument("--st-batches", default=None, help="default: cuda 1,32,64,128,256,512; cpu 1,8,32")
    p.add_argument("--seconds", type=float, default=None, help="default: cuda 1.5, cpu 0.5")
    p.add_argument("--minilm", default=None, help="sentence-transformers model folder")
    p.add_argument("--out", default="bench/results/latest")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dtypes", default=None,
                   help="compute dtypes of the forward scenario (f32,tf32,f16,bf16); default: all on cuda, none on cpu")
    p.add_argument("--forward-batches", default="64,512")
    p.add_argument("--dtype-only", action="store_true",
                   help="only the per-dtype forward and the fp16 sentence-transformers encode")
    p.add_argument("--cpu-threads", type=int, default=None,
                   help="PyTorch intra-op threads (torch.set_num_threads); default: PyTorch's own (all cores)")
    p.add_argument("--dry-run", action="store_true", help="print the plan and exit (no torch needed)")
    p.add_argument("--mlp-graph", action="store_true",
                   help="also run the MLP threading scenario with a CUDA graph per thread (cuda)")
    p.add_argument("--compile-modes", default=None,
                   help="torch.compile modes of the 'compiled' scenario: eager,default,reduce-overhead,max-autotune")
    p.add_argument("--compile-seqs", default="32,128,256,512", help="fixed lengths of the compiled scenario")
    p.add_argument("--compile-dtype", default="f16")
    p.add_argument("--mix", action="store_true", help="also the mixed-length workload in the compiled scenario")
    p.add_argument("--compiled-only", action="store_true", help="only the compiled scenario")
    p.add_argument("--mask-variants", choices=("none", "mask", "both"), default="both",
                   help="fixed-length batches in the compiled scenario: without the attention mask (mode label "
                        "'MODE (no mask)'), with it ('MODE'), or both (default)")
    a = p.parse_args()

    gpu = a.device.startswith("cuda")
    workloads = [w for w in a.workloads.split(",") if w]
    dtypes = [d for d in (a.dtypes if a.dtypes is not None else ("f32,tf32,f16,bf16" if gpu else "")).split(",") if d]
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        sys.exit(f"unknown dtypes {unknown}: expected {','.join(DTYPES)}")
    seqs = [int(w[len("minilm"):]) for w in workloads if w.startswith("minilm")]
    forward_batches = [int(x) for x in a.forward_batches.split(",")]
    if dtypes and seqs and not a.minilm and not a.dry_run:
        sys.exit("--minilm DIR is needed for the minilm workloads")
    bad = [m for m in (a.compile_modes or "").split(",") if m and m not in
           ("eager", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")]
    if bad:
        sys.exit(f"unknown compile modes {bad}")
    if a.dry_run:
        for m in [m for m in (a.compile_modes or "").split(",") if m]:
            for s_ in [int(x) for x in a.compile_seqs.split(",") if x]:
                for b in forward_batches:
                    print(f"compiled {m} {a.compile_dtype} minilm{s_} batch {b}")
            if a.mix:
                for b in forward_batches:
                    print(f"compiled {m} {a.compile_dtype} minilm-mix batch {b} (lengths {min(mix_lengths(b))}-"
                          f"{max(mix_lengths(b))}, mean {sum(mix_lengths(b)) / b:.1f})")
        if a.compiled_only:
            return
        if not a.dtype_only:
            print(f"workloads {workloads} (threading, ceiling) as before")
        for d in dtypes:
            for s_ in seqs:
                for b in forward_batches:
                    print(f"forward {d} minilm{s_} batch {b}")
        if dtypes:
            for s_ in seqs:
                for b in forward_batches:
                    print(f"sentence-transformers encode f16 minilm{s_} batch {b}")
        return
    if a.dtype_only:
        workloads = []
    compile_modes = [m for m in (a.compile_modes or "").split(",") if m]
    if a.compiled_only:
        workloads, dtypes = [], []
        if not compile_modes:
            sys.exit("--compiled-only needs --compile-modes")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")
    if a.cpu_threads:
        torch.set_num_threads(a.cpu_threads)
    dev = torch.device(a.device)
    dev_name = f"{a.device} ({torch.cuda.get_device_name(dev)})" if gpu else "cpu"
    pick = lambda given, cuda, cpu: [int(x) for x in (given or (cuda if gpu else cpu)).split(",")]
    threads = pick(a.threads, "1,8,64" if a.quick else "1,2,4,8,16,32,64", "1,2" if a.quick else "1,2,4")
    mlp_batches = pick(a.mlp_batches, "1,16,64", "1,8")
    st_batches = pick(a.st_batches, "1,32,64,128,256,512", "1,8" if a.quick else "1,8,32")
    seconds = a.seconds or ((0.5 if a.quick else 1.5) if gpu else (0.2 if a.quick else 0.5))
    warm = max(0.2 * seconds, 0.15)
    results = []
    sync = (lambda: torch.cuda.synchronize(dev)) if gpu else (lambda: None)

    def log(r):
        who = f"{r.get('threads', 1)} threads"
        print(f"  {r['workload']} {r['scenario']} {who} batch {r['batch']}: "
              f"{r['throughput_per_s']:.0f} rows/s, p50 {r['latency_ms']['p50']:.3f} ms, "
              f"p99 {r['latency_ms']['p99']:.3f} ms"
              + (f", {r['errors']} errors" if r.get("errors") else ""), file=sys.stderr, flush=True)
        results.append(r)

    print(f"torch_baseline: torch {torch.__version__} on {dev_name} ({torch.get_num_threads()} "
          f"intra-op threads), {seconds} s per point", flush=True)

    if "mlp" in workloads:
        g = torch.Generator().manual_seed(0)
        w1 = (torch.rand(MLP_IN, MLP_HIDDEN, generator=g) * 2 - 1) / 16
        b1 = torch.rand(MLP_HIDDEN, generator=g) * 0.2 - 0.1
        w2 = (torch.rand(MLP_HIDDEN, MLP_IN, generator=g) * 2 - 1) / 32
        b2 = torch.rand(MLP_IN, generator=g) * 0.2 - 0.1
        w1, b1, w2, b2 = (t.to(dev).contiguous() for t in (w1, b1, w2, b2))
        host = torch.rand(INPUT_POOL, MLP_IN, generator=g) * 2 - 1

        def forward(x):
            return torch.nn.functional.gelu(x @ w1 + b1) @ w2 + b2

        def mlp_call(rows, first):
            idx = [(first + r) % INPUT_POOL for r in range(rows)]
            x = host[idx].to(dev)
            return forward(x).cpu()

        with torch.no_grad():
            for b in mlp_batches:
                n, secs, lat, err = closed_loop(1, warm, seconds, lambda t, b=b: (lambda i: mlp_call(b, i * b)))
                log(record(dev_name, "mlp", "ceiling", b, n, secs, lat, threads=1, errors=err or None))
            for t in threads:
                def make(th):
                    stream = torch.cuda.Stream(device=dev) if gpu else None

                    def call(i):
                        torch.set_grad_enabled(False)  # grad mode is per thread
                        if stream is None:
                            return mlp_call(1, th * THREAD_STRIDE + i)
                        with torch.cuda.stream(stream):
                            return mlp_call(1, th * THREAD_STRIDE + i)
                    return call
                n, secs, lat, err = closed_loop(t, warm, seconds, make)
                log(record(dev_name, "mlp", "threading", 1, n, secs, lat, threads=t, errors=err or None))
            if a.mlp_graph and gpu:
                mlp_graph_threading(dev, dev_name, (w1, b1, w2, b2), host, threads, warm, seconds, log)
        sync()

    enc = [w for w in workloads if w.startswith("minilm")]
    if enc:
        from sentence_transformers import SentenceTransformer, __version__ as st_version
        if not a.minilm:
            sys.exit("--minilm DIR is needed for the minilm workloads")
        try:
            model = SentenceTransformer(a.minilm, device=str(dev), model_kwargs={"dtype": torch.float32})
        except TypeError:  # transformers 4.x spells it torch_dtype
            model = SentenceTransformer(a.minilm, device=str(dev), model_kwargs={"torch_dtype": torch.float32})
        param_dtypes = {p.dtype for p in model.parameters()}
        assert param_dtypes == {torch.float32}, f"weights not upcast to fp32: {param_dtypes}"
        model.eval()
        print(f"sentence-transformers {st_version}, model {a.minilm}, fp32", flush=True)
        for w in enc:
            seq = int(w[len("minilm"):])
            sents = [sentence(i, seq) for i in range(INPUT_POOL)]
            got = len(model.tokenizer(sents[0])["input_ids"])
            assert got == seq, f"synthetic sentence tokenized to {got} tokens, expected {seq}"

            def encode(rows, first):
                batch = [sents[(first + r) % INPUT_POOL] for r in range(rows)]
                return model.encode(batch, batch_size=rows, convert_to_numpy=True,
                                    show_progress_bar=False)

            for b in st_batches:
                n, secs, lat, err = closed_loop(1, warm, seconds, lambda t, b=b: (lambda i: encode(b, i * b)))
                log(record(dev_name, w, "ceiling", b, n, secs, lat, threads=1, dtype="f32",
                           model="all-MiniLM-L6-v2 (sentence-transformers)", errors=err or None))
            for t in threads:
                def make(th):
                    stream = torch.cuda.Stream(device=dev) if gpu else None

                    def call(i):
                        if stream is None:
                            return encode(1, th * THREAD_STRIDE + i)
                        with torch.cuda.stream(stream):
                            return encode(1, th * THREAD_STRIDE + i)
                    return call
                n, secs, lat, err = closed_loop(t, warm, seconds, make)
                log(record(dev_name, w, "threading", 1, n, secs, lat, threads=t, dtype="f32",
                           model="all-MiniLM-L6-v2 (sentence-transformers)", errors=err or None))

    if dtypes and seqs:
        dtype_points(a, dev, dev_name, gpu, dtypes, seqs, forward_batches, warm, seconds, log)

    if compile_modes:
        if not a.minilm:
            sys.exit("--minilm DIR is needed for the compiled scenario")
        compiled_points(a, dev, dev_name, a.compile_dtype, compile_modes,
                        [int(x) for x in a.compile_seqs.split(",") if x], forward_batches, a.mix,
                        warm, seconds, log)

    versions = {"torch": torch.__version__, "python": sys.version.split()[0],
                "torch_threads": torch.get_num_threads()}
    if enc:
        versions["sentence_transformers"] = st_version
    if (dtypes and seqs) or compile_modes:
        import sentence_transformers
        import transformers
        versions["transformers"] = transformers.__version__
        versions["sentence_transformers"] = sentence_transformers.__version__
    report = {
        "system": "pytorch", "device": dev_name,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": " ".join(sys.argv), "versions": versions, "results": results,
    }
    os.makedirs(a.out, exist_ok=True)
    path = os.path.join(a.out, "pytorch.json")
    with open(path, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
