#!/usr/bin/env bash
# Issue 19, tokenization off the critical path, on the H100 in one device call: MiniLM f16,
# in-process end to end (the bench's `ceiling`: text in, tokenization included) next to the
# pre-tokenized forward of the same process, at batch 64 and 512, 32 and 128 tokens. Target:
# end to end at batch 512 >= 85% of the forward (the bench's check line says PASS/FAIL).
#
# Three runs of the same points:
#   chunk256  the defaults: `embed` runs a batch of 512 as two chunks of 256, tokenizing the
#             second on the pool while the first runs on the GPU;
#   chunk512  --embed-chunk 512: one device batch per call (the forward's shape), the
#             tokenization of the whole batch on the pool before it, not overlapped;
#   1thread   STREAMPOOL_TOKENIZE_THREADS=1: the chunk256 run with a pool of one thread.
# Each forward record also has host ns per token of tokenizing its batch three ways: the pool
# path (what `embed` does), the fast path on one thread, and `tokenizers`' own `encode_batch`
# (the path before this change; parallel on rayon's global pool).
#
# Build here (no CUDA needed to build):
#   cargo build --release -p streampool-cli --features cuda
#   mkdir -p .dev && cp target/release/streampool .dev/
# with MiniLM's fp16 folder in .dev/minilm-fp16 (see /work/shared/DEVICE.md). Then, as the
# command of a device run with carry [".dev"]:
#   bash scripts/device/e2e-s5.sh
# Writes under $OUT: e2e-{chunk256,chunk512,1thread}.{json,log} and summary.txt (6 + 1 files).
set -euo pipefail
B=${1:-.dev/streampool}
M=${2:-.dev/minilm-fp16}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}

echo "host: $(nproc) cores; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)" | tee "$OUT/summary.txt"
run() { # name, then extra bench flags; a failing run is reported and the next one runs
    local name=$1
    shift
    "$B" bench --device cuda --minilm "$M" --dtype f16 --workloads minilm32,minilm128 \
        --scenarios forward,ceiling --forward-batches 64,512 --ceiling-batches 64,512 \
        --seconds 1.5 --out "$OUT/e2e-$name" "$@" 2>&1 | tee "$OUT/e2e-$name.log" \
        || echo "bench run $name failed (see e2e-$name.log)" | tee -a "$OUT/summary.txt"
    # One JSON per run comes back (the device returns at most 8 files; the plots stay).
    if [ -f "$OUT/e2e-$name/streampool.json" ]; then
        mv "$OUT/e2e-$name/streampool.json" "$OUT/e2e-$name.json"
    fi
    rm -rf "$OUT/e2e-$name"
}
run chunk256
run chunk512 --embed-chunk 512
STREAMPOOL_TOKENIZE_THREADS=1 run 1thread

python3 - "$OUT" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
out = sys.argv[1]
print(f"{'run':<9} {'point':<15} {'batch':>5} {'forward/s':>10} {'e2e/s':>10} {'e2e/fwd':>8}"
      f" {'tok ns/token: pool':>19} {'1 thr':>6} {'tokenizers':>10} {'threads':>7}")
for name in ["chunk256", "chunk512", "1thread"]:
    try:
        rs = json.load(open(f"{out}/e2e-{name}.json"))["results"]
    except OSError:
        print(f"{name}: no results")
        continue
    for f in (r for r in rs if r["scenario"] == "forward"):
        e = next((r for r in rs if r["scenario"] == "ceiling" and r["workload"] == f["workload"]
                  and r["batch"] == f["batch"]), None)
        print(f"{name:<9} {f['workload'] + ' ' + f['dtype']:<15} {f['batch']:>5}"
              f" {f['throughput_per_s']:>10.0f} {e['throughput_per_s'] if e else 0:>10.0f}"
              f" {100 * e.get('forward_fraction', 0) if e else 0:>7.1f}%"
              f" {f['tokenize_ns_per_token']:>19.1f} {f['tokenize_serial_ns_per_token']:>6.1f}"
              f" {f['tokenize_tokenizers_ns_per_token']:>10.0f} {f['tokenize_threads']:>7}")
EOF
