#!/usr/bin/env bash
# Issue #19, batching that never waits for nothing, on the H100 in one device call: the
# BatchQueue points the issue names, MiniLM f16 at 32 and 128 tokens, each with the new
# default (max_wait 0: continuous batching) next to the old window (max_wait 1 ms):
#   1. one caller through the queue vs the same model called directly from one thread
#      (target: queue p50 within 0.1 ms of the direct call);
#   2. 64 single-sentence callers vs the pre-tokenized forward at batch 64, same process
#      (target: >= 80% of the forward), with the default 2 pipelined workers and with 1 (two
#      workers each form from what is queued, so closed-loop callers may split between them
#      into smaller batches; one worker shows what that costs).
# Writes 1caller.{log,json}, callers64.{log,json}, callers64-w1.{log,json} and summary.txt
# under $OUT (7 files) and prints the summary last.
#
# Build here (no GPU needed), then carry .dev:
#   cargo build --release -p streampool-cli --features cuda
#   mkdir -p .dev && cp target/release/streampool .dev/
#   (.dev/minilm-fp16: all-MiniLM-L6-v2 in fp16, scripts/make_fp16_minilm.py; see DEVICE.md)
# There: bash scripts/device/batching-s5.sh [BINARY] [MINILM_DIR]   (DEVICE=cpu DTYPE=f32 to try it here)
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${1:-.dev/streampool}
M=${2:-.dev/minilm-fp16}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
work=$(mktemp -d)
common=(--device "${DEVICE:-cuda}" --minilm "$M" --dtype "${DTYPE:-f16}" --workloads minilm32,minilm128
    --max-batch 64 --seconds 2)

# 1. One caller: the direct call (threading, ceiling at batch 1) and the queue at max_wait 0
#    and 1 ms (batching at 1 caller, both windows).
"$B" bench "${common[@]}" --scenarios threading,ceiling,batching --threads 1 \
    --max-wait-ms 0,1 --ceiling-batches 1 --out "$work/1caller" 2>&1 | tee "$OUT/1caller.log"
cp "$work/1caller/streampool.json" "$OUT/1caller.json"

# 2. 64 callers, max_batch 64: the queue at max_wait 0 and 1 ms next to the forward at 64.
"$B" bench "${common[@]}" --scenarios forward,ceiling,batching --threads 64 \
    --max-wait-ms 0,1 --forward-batches 64 --ceiling-batches 64 --out "$work/callers64" 2>&1 \
    | tee "$OUT/callers64.log"
cp "$work/callers64/streampool.json" "$OUT/callers64.json"

# 3. The same 64 callers with one worker (continuous batching only).
"$B" bench "${common[@]}" --scenarios forward,batching --threads 64 --forward-batches 64 \
    --max-wait-ms 0 --workers 1 --out "$work/callers64-w1" 2>&1 | tee "$OUT/callers64-w1.log"
cp "$work/callers64-w1/streampool.json" "$OUT/callers64-w1.json"

python3 - "$OUT/1caller.json" "$OUT/callers64.json" "$OUT/callers64-w1.json" <<'EOF' \
    | tee "$OUT/summary.txt"
import json, sys
runs = [json.load(open(f)) for f in sys.argv[1:]]
one = runs[0]["results"]
many = runs[1]["results"] + runs[2]["results"]
models = sorted({r["model"] for r in one + many if r.get("model")})

def pick(rs, **kw):
    return [r for r in rs if all(r.get(k) == v for k, v in kw.items())]

print(f"BatchQueue on {runs[0]['device']} ({', '.join(models)}): 1 caller vs a direct call; "
      "64 callers vs the forward at 64")
for w in sorted({r["workload"] for r in one + many if r["scenario"] == "batching"}):
    direct = pick(one, workload=w, scenario="threading", threads=1)
    if direct:
        d = direct[0]["latency_ms"]["p50"]
        print(f"{w}: direct call (1 thread) p50 {d:.3f} ms")
        for q in sorted(pick(one, workload=w, scenario="batching", callers=1),
                        key=lambda r: r["max_wait_ms"]):
            p50 = q["latency_ms"]["p50"]
            ok = "PASS" if p50 - d <= 0.1 else "FAIL"
            print(f"  queue, 1 caller, max_wait {q['max_wait_ms']:g} ms: p50 {p50:.3f} ms "
                  f"(+{p50 - d:.3f} ms; target <= +0.1: {ok})")
    fwd = pick(runs[1]["results"], workload=w, scenario="forward", batch=64)
    if fwd:
        f = fwd[0]["throughput_per_s"]
        print(f"{w}: forward at batch 64 {f:,.0f} sentences/s")
        for q in sorted(pick(many, workload=w, scenario="batching", callers=64),
                        key=lambda r: (-r["workers"], r["max_wait_ms"])):
            frac = q["throughput_per_s"] / f
            ok = "PASS" if frac >= 0.8 else "FAIL"
            print(f"  queue, 64 callers, {q['workers']} workers, max_wait {q['max_wait_ms']:g} ms: "
                  f"{q['throughput_per_s']:,.0f}/s = {100 * frac:.0f}% (target >= 80%: {ok}), "
                  f"mean batch {q.get('mean_batch_size', 0):.1f}, p50 {q['latency_ms']['p50']:.3f} ms, "
                  f"p99 {q['latency_ms']['p99']:.3f} ms, prepare/forward "
                  f"{q.get('prepare_ms_per_batch') or 0:.2f}/{q.get('forward_ms_per_batch') or 0:.2f} ms per batch")
EOF
rm -rf "$work"
