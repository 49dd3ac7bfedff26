#!/usr/bin/env bash
# Issue #10 on the H100, one device call: the like-for-like table (ours forward and end to end
# per dtype vs PyTorch forward per dtype and sentence-transformers fp16 encode) and BatchQueue
# with 64 single-sentence callers in f16, with the preparing stage (tokenization overlapping
# the GPU) and without it. Everything lands in $OUT (default bench/results/latest).
#
# Build first, off the GPU machine or on it:
#   cargo build --release -p streampool-cli --features cuda
# then: bash scripts/device/dtypes-host.sh [BINARY] [MINILM_DIR]
set -euo pipefail
B=${1:-target/release/streampool}
M=${2:-.dev/minilm-fp16}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"

# 1. Ours per dtype: forward (pre-tokenized) and ceiling (end to end) at batches 64 and 512.
"$B" bench --device cuda --minilm "$M" --dtypes f32,tf32,f16,bf16 --workloads minilm32,minilm128 \
    --scenarios forward,ceiling --ceiling-batches 64,512 --forward-batches 64,512 --seconds 1 \
    --out "$OUT/ours-dtypes" 2>&1 | tee "$OUT/ours-dtypes.log"

# 2. BatchQueue, 64 callers, f16, max_batch 64, 1 ms, through the inference core's embedder
#    (each caller tokenizes its own text, as a server handler does). Each JSON batching point has ceiling_fraction
#    (vs end to end at batch 64), forward_fraction (vs the f16 forward at batch 64, target
#    >= 0.9), prepare_ms_per_batch and forward_ms_per_batch (the host share of a batch).
for mode in core; do
    extra=()
    "$B" bench --device cuda --minilm "$M" --dtype f16 --workloads minilm32,minilm128 \
        --scenarios forward,ceiling,batching --threads 64 --max-batch 64 --max-wait-ms 1 \
        --ceiling-batches 64 --forward-batches 64 --seconds 1.5 "${extra[@]}" \
        --out "$OUT/ours-queue-f16-$mode" 2>&1 | tee "$OUT/ours-queue-f16-$mode.log"
done

# 3. PyTorch per dtype (HF forward with SDPA, pre-tokenized, upload + read-back included) and
#    sentence-transformers encode fp16 end to end.
python3 bench/torch_baseline.py --device cuda --minilm "$M" --dtype-only \
    --workloads minilm32,minilm128 --out "$OUT" 2>&1 | tee "$OUT/torch.log"

# 4. The table.
python3 bench/compare.py --dtypes "$OUT/ours-dtypes/streampool.json" "$OUT/pytorch.json" \
    | tee "$OUT/compare-dtypes.md"
