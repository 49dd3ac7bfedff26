#!/usr/bin/env bash
# One GPU against all GPUs of a host: the same `streampool` binary serves a sentence embedder
# (e.g. MiniLM) and the demo MLP, first with `--device $ONE` and then with `--device $ALL`
# (one model replica per device behind the least-loaded router), and the same wrk load runs
# against each; prints a markdown table per run and the throughput ratio ALL / ONE.
#
#   scripts/multi-gpu-load.sh BIN MODEL_DIR WRK
#       BIN        a streampool binary (built with --features cuda for GPUs)
#       MODEL_DIR  an embedding model folder (config.json, model.safetensors, tokenizer.json);
#                  it is served under the folder's name
#       WRK        a wrk binary (Debian's `wrk`, as scripts/load-test.sh uses); when the
#                  folder ../lib/x86_64-linux-gnu next to it exists (an unpacked .deb, see
#                  `pack-wrk` below) it is put on LD_LIBRARY_PATH, so no install is needed
#
#   ONE=cuda:0 ALL=cuda:all DURATION=20s CONCURRENCY="64 256" scripts/multi-gpu-load.sh ...
#   ONE=cpu ALL=cpu:0,cpu:1 DURATION=3s CONCURRENCY=16 scripts/multi-gpu-load.sh \
#       target/release/streampool models/tiny-bert /usr/bin/wrk          # a CPU dry run
#
#   scripts/multi-gpu-load.sh pack-wrk DIR
#       downloads Debian's wrk, LuaJIT and OpenSSL 3 .debs (apt-get download: needs the
#       network) and unpacks them into DIR, giving DIR/usr/bin/wrk (about 8 MB with its
#       libraries) to carry to a machine without wrk, network or root (it needs that
#       machine's glibc only)
#
# Environment: ONE, ALL (device specs), DURATION (per point), CONCURRENCY (list),
# THREADS (wrk threads, default min(c, nproc/2)), TEXTS (sentences per embedding request,
# default 8), ROWS (MLP rows per request, default 16), PORT, SERVE_ARGS (extra serve flags),
# OUT (folder for the server logs and the table, default a temporary one).
set -euo pipefail

if [ "${1:-}" = pack-wrk ]; then
    dir=${2:?usage: $0 pack-wrk DIR}
    mkdir -p "$dir"
    dir=$(cd "$dir" && pwd)
    tmp=$(mktemp -d)
    (cd "$tmp" && apt-get download wrk libluajit2-5.1-2 libluajit2-5.1-common libssl3 >/dev/null 2>&1)
    for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$dir"; done
    rm -rf "$tmp"
    LD_LIBRARY_PATH="$dir/usr/lib/x86_64-linux-gnu" "$dir/usr/bin/wrk" --version 2>&1 | head -1 || true
    echo "$dir/usr/bin/wrk"
    exit 0
fi

BIN=${1:?usage: $0 BIN MODEL_DIR WRK}
MODEL_DIR=${2:?usage: $0 BIN MODEL_DIR WRK}
WRK=${3:?usage: $0 BIN MODEL_DIR WRK}
ONE=${ONE:-cuda:0}
ALL=${ALL:-cuda:all}
DURATION=${DURATION:-20s}
CONCURRENCY=${CONCURRENCY:-"64 256"}
TEXTS=${TEXTS:-8}
ROWS=${ROWS:-16}
PORT=${PORT:-18090}
SERVE_ARGS=${SERVE_ARGS:-}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
NAME=$(basename "$MODEL_DIR")
CORES=$(nproc)

wrk_libs="$(dirname "$WRK")/../lib/x86_64-linux-gnu"
if [ -d "$wrk_libs" ]; then
    export LD_LIBRARY_PATH="$(cd "$wrk_libs" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
"$WRK" --version >/dev/null 2>&1 || [ $? -eq 1 ] || { echo "$WRK does not run" >&2; exit 1; }

# Ready when /v2/health/ready answers 200: curl if there is one, else python3, else bash.
ready() {
    if command -v curl >/dev/null; then
        curl -sf "http://127.0.0.1:$PORT/v2/health/ready" >/dev/null
    elif command -v python3 >/dev/null; then
        python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/v2/health/ready', timeout=1)" 2>/dev/null
    else
        (exec 3<>"/dev/tcp/127.0.0.1/$PORT" && printf 'GET /v2/health/ready HTTP/1.0\r\n\r\n' >&3 && head -1 <&3 | grep -q ' 200') 2>/dev/null
    fi
}

# The request bodies: TEXTS sentences per embedding request, ROWS rows per MLP request.
texts=$(for i in $(seq 1 "$TEXTS"); do printf '"Sentence %d of the load: streams, events and a caching allocator.",' "$i"; done)
texts="[${texts%,}]"
row=$(awk 'BEGIN { for (i = 0; i < 256; i++) printf "%s%.4f", (i ? "," : ""), (i % 17) / 17 - 0.5 }')
rows=$(for _ in $(seq 1 "$ROWS"); do printf '%s,' "$row"; done)
rows="${rows%,}"
lua() { # file body
    cat >"$1" <<LUA
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
lua "$OUT/embed.lua" "{\"model\": \"$NAME\", \"input\": $texts}"
lua "$OUT/mlp.lua" "{\"inputs\": [{\"name\": \"input\", \"shape\": [$ROWS, 256], \"datatype\": \"FP32\", \"data\": [$rows]}]}"
declare -A path=([embed]=/v1/embeddings [mlp]=/v2/models/mlp/infer)
declare -A per_request=([embed]=$TEXTS [mlp]=$ROWS)
declare -A best

server=
stop() {
    if [ -n "$server" ]; then
        kill -TERM "$server" 2>/dev/null || true
        wait "$server" 2>/dev/null || true
        server=
    fi
}
trap stop EXIT

table="$OUT/table.md"
: >"$table"
say() { echo "$@" | tee -a "$table"; }

for devices in "$ONE" "$ALL"; do
    log="$OUT/server-${devices//[:,]/_}.log"
    # shellcheck disable=SC2086 # SERVE_ARGS is a list of flags
    "$BIN" serve --device "$devices" --model "$MODEL_DIR" --port "$PORT" --max-queue 8192 \
        --max-inputs 1024 $SERVE_ARGS >"$log" 2>&1 &
    server=$!
    for _ in $(seq 1 1200); do
        ready && break
        kill -0 "$server" 2>/dev/null || { cat "$log" >&2; exit 1; }
        sleep 0.25
    done
    ready || { echo "server on $devices never became ready" >&2; cat "$log" >&2; exit 1; }
    # Warm-up, not reported: first use compiles kernels and fills the allocator caches.
    for t in embed mlp; do
        "$WRK" -t 2 -c 32 -d 3s -s "$OUT/$t.lua" "http://127.0.0.1:$PORT${path[$t]}" >/dev/null
    done
    say ""
    say "### \`--device $devices\`: $(grep -m1 '^listening on' "$log" || true)"
    say ""
    say "| target | inputs/request | concurrency | requests | req/s | inputs/s | p50 ms | p99 ms | errors |"
    say "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    for t in embed mlp; do
        for c in $CONCURRENCY; do
            threads=${THREADS:-$(( c < CORES / 2 ? c : (CORES / 2 > 0 ? CORES / 2 : 1) ))}
            line=$("$WRK" -t "$threads" -c "$c" -d "$DURATION" --timeout 30s -s "$OUT/$t.lua" \
                "http://127.0.0.1:$PORT${path[$t]}" | grep '^RESULT')
            read -r _ n rps p50 p99 errors <<<"$line"
            inputs=$(awk -v r="$rps" -v k="${per_request[$t]}" 'BEGIN { printf "%.0f", r * k }')
            say "| ${path[$t]} | ${per_request[$t]} | $c | $n | $rps | $inputs | $p50 | $p99 | $errors |"
            key="$devices/$t"
            if awk -v a="$rps" -v b="${best[$key]:-0}" 'BEGIN { exit !(a > b) }'; then
                best[$key]=$rps
            fi
        done
    done
    curl -sf "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-${devices//[:,]/_}.txt" 2>/dev/null || true
    stop
done

say ""
say "### Throughput, best concurrency: \`$ALL\` / \`$ONE\`"
say ""
say "| target | $ONE req/s | $ALL req/s | ratio |"
say "|---|---:|---:|---:|"
for t in embed mlp; do
    a=${best[$ONE/$t]}
    b=${best[$ALL/$t]}
    ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.2f", (a > 0 ? b / a : 0) }')
    say "| ${path[$t]} | $a | $b | ${ratio}x |"
done
say ""
say "$(uname -m), $CORES CPU cores, wrk $DURATION per point, model $NAME; logs in $OUT"
