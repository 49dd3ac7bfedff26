#!/usr/bin/env python3
"""Where a served request's CPU goes: each sample of a `perf record --call-graph dwarf` profile of
`streampool serve` is attributed to the innermost stack frame (leaf upward) that names one of
the categories below (forward, tokenization, JSON, HTTP, batch queue, tokio, ...), and the
shares are printed. bench/results/served-cpu/README.md has its figures.

Usage: perf record -F 499 --call-graph dwarf,16384 -p SERVER_PID -o perf.data -- sleep 4
       python3 scripts/perf_categories.py perf.data
"""
import sys, re, subprocess, collections
data = sys.argv[1]
txt = subprocess.run(["perf","script","-i",data,"-F","comm,tid,ip,sym"],capture_output=True,text=True).stdout
rules = [
 ("forward (model on the CPU device)", r"streampool::cpu|matrixmultiply|libm::|erff|expf|streampool::tensor|streampool_nn::bert|streampool_nn::layers|streampool_nn::pooling|forward_batch"),
 ("tokenization", r"tokenizers::|unicode_categories|unicode_normalization|EmbedderEndpoint::tokenize|tokenize_all|tokenize_with"),
 ("JSON encode (response)", r"serde_json::ser|zmij|ryu|IntoResponse for axum::json|Json<T> as axum_core::response::IntoResponse|base64::engine"),
 ("JSON parse (request)", r"serde_json::de|parse_input|serde_json::read"),
 ("HTTP (hyper, axum, tower)", r"hyper::|axum::|tower::|axum_core::|http::"),
 ("batch queue hand-off", r"streampool_batch::|crossbeam|run_all"),
 ("metrics", r"prometheus|metrics::"),
 ("async runtime (tokio)", r"tokio::"),
]
cats = collections.Counter(); total = 0
for block in txt.split("\n\n"):
    lines = [l for l in block.strip().splitlines()]
    if not lines: continue
    total += 1
    frames = lines[1:]
    hit = None
    for f in frames:
        for name, rx in rules:
            if re.search(rx, f):
                hit = name; break
        if hit: break
    if hit is None:
        hit = "kernel (scheduler, syscalls)" if frames and re.search(r"\[unknown\]|\bk\b|kallsyms", frames[0]) and not any("streampool" in f for f in frames) else "unattributed"
    cats[hit] += 1
for k, v in cats.most_common():
    print(f"{100*v/total:6.1f}%  {k}")
print(f"({total} samples)")
