#!/usr/bin/env bash
# Load sweep of `streampool serve` on loopback with wrk (Debian's `wrk`, a load generator
# no one here wrote): concurrency 1, 4, 16, 64 against /v1/embeddings (tiny-bert) and the
# KServe infer of tiny-bert and of the demo MLP, each run bounded in time. Starts the server
# (release build), prints a markdown table, stops the server with SIGTERM (graceful).
#
#   scripts/load-test.sh                       # CPU, 10 s per point
#   DURATION=5s CONCURRENCY="1 64" scripts/load-test.sh
#   DEVICE=cuda scripts/load-test.sh           # needs a binary built with --features cuda
#   SERVE_ARGS="--max-wait-ms 1" scripts/load-test.sh   # extra `streampool serve` flags
# Without wrk (e.g. on the GPU machine), `streampool loadgen` is the project's own load
# generator (bench/README.md; `scripts/device/run.sh served` runs the served points).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10s}
CONCURRENCY=${CONCURRENCY:-"1 4 16 64"}
PORT=${PORT:-18080}
DEVICE=${DEVICE:-cpu}
BIN=${BIN:-target/release/streampool}
SERVE_ARGS=${SERVE_ARGS:-}
command -v wrk >/dev/null || { echo "wrk not found: apt-get install wrk" >&2; exit 1; }
[ -x "$BIN" ] || cargo build --release -p streampool-cli >&2

tmp=$(mktemp -d)
# shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
"$BIN" serve --device "$DEVICE" --port "$PORT" --max-queue 4096 $SERVE_ARGS >"$tmp/server.log" 2>&1 &
server=$!
stop() {
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    rm -rf "$tmp"
}
trap stop EXIT
for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null && break
    kill -0 "$server" 2>/dev/null || { cat "$tmp/server.log" >&2; exit 1; }
    sleep 0.1
done

# One wrk Lua script per target: a fixed POST body, and a summary line at the end.
lua() { # name body
    cat >"$tmp/$1.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = [[$2]]
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT %d %.1f %.3f %.3f %d\n", summary.requests,
    summary.requests / (summary.duration / 1e6), latency:percentile(50) / 1000,
    latency:percentile(99) / 1000, e.connect + e.read + e.write + e.status + e.timeout))
end
LUA
}
row=$(python3 -c 'print(",".join(str((i % 17) / 17 - 0.5) for i in range(256)))')
lua embeddings '{"model": "tiny-bert", "input": "The quick brown fox jumps over the lazy dog."}'
lua kserve-embedder '{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["The quick brown fox jumps over the lazy dog."]}]}'
lua kserve-mlp "{\"inputs\": [{\"name\": \"input\", \"shape\": [1, 256], \"datatype\": \"FP32\", \"data\": [$row]}]}"

# Warm-up, not reported: first use compiles kernels (CUDA) and fills the allocator's cache.
for target in embeddings kserve-embedder kserve-mlp; do
    wrk -t 2 -c 8 -d 2s -s "$tmp/$target.lua" "http://127.0.0.1:$PORT$(
        case $target in embeddings) echo /v1/embeddings ;; kserve-embedder) echo /v2/models/tiny-bert/infer ;;
            kserve-mlp) echo /v2/models/mlp/infer ;; esac)" >/dev/null
done

declare -A path=(
    [embeddings]=/v1/embeddings
    [kserve-embedder]=/v2/models/tiny-bert/infer
    [kserve-mlp]=/v2/models/mlp/infer
)
echo "streampool serve on $DEVICE${SERVE_ARGS:+ ($SERVE_ARGS)} ($(nproc) CPU cores, $(uname -m)), wrk $DURATION per point, one input per request, loopback"
echo
echo "| endpoint | concurrency | requests | req/s | p50 ms | p99 ms | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|"
for target in embeddings kserve-embedder kserve-mlp; do
    for c in $CONCURRENCY; do
        threads=$(( c < 2 ? c : 2 ))
        line=$(wrk -t "$threads" -c "$c" -d "$DURATION" --timeout 10s -s "$tmp/$target.lua" \
            "http://127.0.0.1:$PORT${path[$target]}" | grep '^RESULT')
        read -r _ n rps p50 p99 errors <<<"$line"
        echo "| \`${path[$target]}\` | $c | $n | $rps | $p50 | $p99 | $errors |"
    done
done
