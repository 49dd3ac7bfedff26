#!/usr/bin/env bash
# `serve`'s first seconds after ready against its steady state, in one device call: MiniLM
# f16, 256 clients x one 128-token sentence (loadgen --corpus long), latency over the first
# 3 s after the server answers /health and over the next 6 s, twice:
#   fresh  a machine that never ran it (empty kernel and tuning caches)
#   warm   the same machine again (a new replica: caches warm)
# The server's warm-up tunes cuBLASLt for batches up to --max-batch-tokens before it listens
# (or reads the tuning cache); --no-warm-up would leave that to the first requests.
#
# Build and carry as for scripts/device/first-use.sh (DIR: streampool.xz, minilm-f16).
# There: bash scripts/device/served-first-seconds.sh DIR
# Writes $OUT/served-first-seconds.json (every loadgen point) and served-first-seconds.log.
set -uo pipefail
D=${1:?usage: served-first-seconds.sh DIR}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
work=$(mktemp -d /tmp/served-first.XXXXXX)
unxz() { python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2"; }
B=$work/streampool
unxz "$D/streampool.xz" "$B" && chmod +x "$B"
M=$work/minilm-f16
cp -r "$D/minilm-f16" "$M"
[ -f "$M/model.safetensors.xz" ] && unxz "$M/model.safetensors.xz" "$M/model.safetensors" && rm "$M/model.safetensors.xz"
LOG=$OUT/served-first-seconds.log
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$LOG"

load() {
    "$B" loadgen --url http://127.0.0.1:18400 --corpus long -c 256 --warmup 0 --tokenizer "$M" "$@" 2>&1 |
        tail -n 4 | tee -a "$LOG"
}
for name in fresh warm; do
    echo "== $name" | tee -a "$LOG"
    STREAMPOOL_CACHE_DIR=$work/kernel-cache "$B" serve --device cuda --model "$M" --port 18400 \
        >"$work/$name-serve.log" 2>&1 &
    pid=$!
    load --wait-ready 120 --duration 3 --server-pid $pid --json "$work/$name-first.json"
    load --duration 6 --server-pid $pid --json "$work/$name-steady.json"
    grep -a "startup:" "$work/$name-serve.log" | tail -n 1 | tee -a "$LOG"
    kill $pid
    wait $pid
done

python3 - "$work" "$OUT/served-first-seconds.json" <<'PY' | tee -a "$LOG"
import json, pathlib, sys
w = pathlib.Path(sys.argv[1])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(w.glob("*-*.json"))}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print("run    window        sent/s     p50 ms   p99 ms")
for name in ("fresh", "warm"):
    for part in ("first", "steady"):
        p = rows[f"{name}-{part}"]["points"][0]
        print(f"{name:6} {part:8} {p.get('sentences_per_s', 0):12.0f} {p['latency_ms']['p50']:9.2f} "
              f"{p['latency_ms']['p99']:8.2f}")
PY
