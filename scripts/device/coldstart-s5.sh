#!/usr/bin/env bash
# Issue 19 on the H100, one device call: `streampool serve --device cuda` with MiniLM f16,
# timed from launch to /v2/health/ready answering (scripts/device/coldstart.py), in six runs:
#   1 first-ever start (empty kernel cache, empty driver JIT cache)
#   2, 3 the same machine again (warm kernel cache: the <= 3 s target)
#   4 kernel cache off (NVRTC compiles a cubin on every start)
#   5 kernel cache off and PTX forced with a cold driver JIT cache (the path before the cache:
#     NVRTC to PTX, then the driver's JIT)
#   6 warm cache without the warm-up forward (what the warm-up costs at start, and what the
#     first request pays without it)
#   7 (if BASELINE is set) an older binary, e.g. main before this branch, cold JIT cache
# Run it FIRST in a fresh device call: run 1 is only first-ever while the page cache, the
# driver and the GPU are fresh too.
#
# Build here: cargo build --release -p streampool-cli --features cuda
#   mkdir -p .dev && cp target/release/streampool .dev/ && strip .dev/streampool
#   python3 scripts/make_fp16_minilm.py .dev/minilm-fp16    # ~45 MB, once
# There (carry [".dev"]): bash scripts/device/coldstart-s5.sh [BINARY] [MODEL_DIR]
# Writes $OUT/coldstart-summary.md (table), coldstart.json, coldstart-runs.log, gpu.txt.
set -euo pipefail
B=${1:-.dev/streampool}
M=${2:-.dev/minilm-fp16}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
{
    nvidia-smi --query-gpu=name,driver_version,persistence_mode,compute_mode --format=csv
    echo "CUDA_MODULE_LOADING=${CUDA_MODULE_LOADING:-unset (LAZY is the default from CUDA 12.2)}"
    nproc; free -g | head -2
} 2>&1 | tee "$OUT/gpu.txt"
work=$(mktemp -d /tmp/coldstart.XXXXXX)
baseline=()
[ -n "${BASELINE:-}" ] && baseline=(--baseline "$BASELINE")
python3 scripts/device/coldstart.py --bin "$B" --model "$M" --out "$OUT" --work "$work" \
    "${baseline[@]}" 2>&1 | tee "$OUT/coldstart.log"
