#!/usr/bin/env bash
# Issue #19 on the H100, one device call: the served figures next to the pre-tokenized forward
# of the same model, in the same call.
#
#   1. `streampool bench` forward (pre-tokenized, f16) at 16 and 128 tokens, batches 1-512:
#      the device's ceiling the served figures are compared with (server not running).
#   2. `streampool serve --device cuda --model .dev/minilm-fp16` with default settings, pinned
#      to SERVER_CORES; launch-to-ready time; then `streampool loadgen` pinned to LG_CORES:
#      - latency: 1 client, one short sentence per request (target p50 <= 0.6 ms);
#      - single-input curves, short and long: 1, 16, 64, 256 clients (target: 256 clients x
#        one 128-token sentence >= 60,000 sentences/s);
#      - bulk: 32 short sentences per request at rising concurrency until errors (503s)
#        appear (target: 64 clients >= 220,000 sentences/s with 0 errors);
#      - bulk 64 x 32 with base64 answers and through TEI's /embed (encoding cost).
#   3. The server again with --phase-timing: host time per phase of a request (read, JSON
#      parse, tokenize, queue, encode) at 256 x 1 long and 64 x 32 short.
#
# Needs (carry [".dev"]): .dev/streampool (cargo build --release -p streampool-cli --features
# cuda) and .dev/minilm-fp16 (scripts/make_fp16_minilm.py). Run from the repository root:
#   bash scripts/device/served-s5.sh
# Writes under $OUT (at most 8 files come back): served-s5.tgz (every log and JSON),
# summary.md (the table printed last), loadgen.log, server.log, forward.log.
set -euo pipefail
cd "$(dirname "$0")/../.."
B=${B:-.dev/streampool}
M=${M:-.dev/minilm-fp16}
# A dry run of this script on a CPU machine: DEVICE=cpu DTYPE=f32 M=models/tiny-bert
# B=target/release/streampool DURATION=1 SERVER_CORES=0 LG_CORES=1 OUT=/tmp/s5 bash ...
DEVICE=${DEVICE:-cuda}
DTYPE=${DTYPE:-f16}
OUT=${OUT:-bench/results/latest}
PORT=${PORT:-18090}
DURATION=${DURATION:-8}
WARMUP=${WARMUP:-2}
# 16 cores: the server (tokenization, HTTP, batch workers) on 12, the load generator on 4.
# Its CPU use is in every line ("lg cpu", in cores): near 4.0 means it, not the server,
# may be the bound; rerun with more LG_CORES then.
SERVER_CORES=${SERVER_CORES:-0-11}
LG_CORES=${LG_CORES:-12-15}
mkdir -p "$OUT"
W=$(mktemp -d)
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
pin() { # cores command...: runs pinned where taskset exists
    local cores=$1
    shift
    if command -v taskset >/dev/null; then taskset -c "$cores" "$@"; else "$@"; fi
}
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    echo "cores: $(nproc); taskset: $(command -v taskset || echo none); server on $SERVER_CORES, loadgen on $LG_CORES"
    git log -1 --format='commit %h %s' 2>/dev/null || true
} | tee "$W/env.txt"

# 1. The pre-tokenized forward (no server running).
"$B" bench --device "$DEVICE" --minilm "$M" --dtype "$DTYPE" --workloads minilm16,minilm128 \
    --scenarios forward --forward-batches 1,32,64,512 --seconds 1.5 --out "$W/forward" \
    >"$W/forward.log" 2>&1 || echo "forward bench failed (see forward.log)"

server=
start_server() { # name extra-flags...
    local name=$1
    shift
    local t0
    t0=$(date +%s%N)
    # Started directly (not through a shell function), so $! is the server's own pid:
    # taskset execs the server in place.
    if command -v taskset >/dev/null; then
        taskset -c "$SERVER_CORES" "$B" serve --device "$DEVICE" --model "$M" --port "$PORT" "$@" \
            >"$W/server-$name.log" 2>&1 &
    else
        "$B" serve --device "$DEVICE" --model "$M" --port "$PORT" "$@" >"$W/server-$name.log" 2>&1 &
    fi
    server=$!
    pin "$LG_CORES" "$B" loadgen --url "http://127.0.0.1:$PORT" --wait-ready 120 \
        --requests 1 --warmup 0 >/dev/null
    echo "server $name ($*): ready after $(( ($(date +%s%N) - t0) / 1000000 )) ms (pid $server)" \
        | tee -a "$W/env.txt"
}
stop_server() {
    [ -n "$server" ] || return 0
    kill -TERM "$server" 2>/dev/null || true
    wait "$server" 2>/dev/null || true
    server=
}
trap 'stop_server; tar czf "$OUT/served-s5.tgz" -C "$W" . 2>/dev/null || true' EXIT

lg() { # json-name loadgen-flags...
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$W/loadgen.log"
    pin "$LG_CORES" "$B" loadgen --url "http://127.0.0.1:$PORT" --server-pid "$server" \
        --tokenizer "$M/tokenizer.json" --warmup "$WARMUP" --duration "$DURATION" \
        --json "$W/$name.json" "$@" 2>&1 | tee -a "$W/loadgen.log" || true
}

# 2. Default settings.
start_server default
lg latency -c 1 -k 1 --corpus short
lg short-k1 -c 1,16,64,256 -k 1 --corpus short
lg long-k1 -c 1,16,64,256 -k 1 --corpus long
lg bulk-k32 -c 16,32,64,128,256,512 -k 32 --corpus short --until-errors
lg bulk-k32-base64 -c 64 -k 32 --corpus short --encoding base64
lg bulk-k32-tei -c 64 -k 32 --corpus short --route tei
stop_server

# 3. Phase timing.
start_server phases --phase-timing
lg phases-long-k1 -c 256 -k 1 --corpus long
lg phases-bulk-k32 -c 64 -k 32 --corpus short
lg phases-latency -c 1 -k 1 --corpus short
stop_server

cp "$W/loadgen.log" "$W/forward.log" "$OUT/" 2>/dev/null || true
cat "$W"/server-*.log >"$OUT/server.log" 2>/dev/null || true

# The table, last.
python3 - "$W" <<'PY' | tee "$W/summary.md" "$OUT/summary.md"
import json, sys, glob, os
w = sys.argv[1]
fwd = {}
try:
    for r in json.load(open(f"{w}/forward/streampool.json"))["results"]:
        if r["scenario"] == "forward":
            fwd[(r["workload"], r["batch"])] = r["throughput_per_s"]
except Exception as e:
    print(f"(no forward figures: {e})")
print("forward, pre-tokenized (sentences/s): " + ", ".join(
    f"{k[0]} b{k[1]} {v:,.0f}" for k, v in sorted(fwd.items())))
print()
print("| run | route | K | text | conns | sentences/s | vs forward b512 | p50 ms | p99 ms | errors | answers | lg cpu | server cpu | batch | busy |")
print("|---|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|")
f = lambda v, p=2: "-" if v is None else f"{v:,.{p}f}"
pts = {}
for path in sorted(glob.glob(f"{w}/*.json"), key=os.path.getmtime):  # in the order run
    name = os.path.basename(path)[:-5]
    for p in json.load(open(path))["points"]:
        s = p.get("server") or {}
        seq = 128 if p["corpus"] == "long" else 16
        ref = fwd.get((f"minilm{seq}", 512))
        ans = " ".join(f"{k}:{v}" for k, v in p["answered"].items())
        if p["io_errors"]: ans += f" io:{p['io_errors']}"
        if p["malformed"]: ans += f" malformed:{p['malformed']}"
        print(f"| {name} | {p['route']}{'/b64' if p['encoding'] == 'base64' else ''} | {p['inputs_per_request']} | {p['corpus']} "
              f"| {p['concurrency']} | {p['sentences_per_s']:,.0f} | {f(p['sentences_per_s'] / ref if ref else None)} "
              f"| {p['latency_ms']['p50']:.3f} | {p['latency_ms']['p99']:.3f} | {p['errors']} | {ans} "
              f"| {p['loadgen_cpu']['cores']:.2f} | {f(s.get('cpu_cores'))} | {f(s.get('mean_batch_size'), 1)} | {f(s.get('device_busy_per_s'))} |")
        pts[(name, p["concurrency"])] = p
        if s.get("phases"):
            print(f"|  | host phases, mean us: " + ", ".join(
                f"{k} {v['mean_us']:.1f}" for k, v in sorted(s["phases"].items(),
                key=lambda kv: ["read", "parse", "tokenize", "queue", "encode", "total"].index(kv[0]))) + " | | | | | | | | | | | | | |")
print()
def check(what, key, ok):
    p = pts.get(key)
    print(f"- {what}: " + ("not measured" if p is None else ("PASS" if ok(p) else "FAIL")))
check("1 client, one short sentence, p50 <= 0.6 ms", ("latency", 1), lambda p: p["latency_ms"]["p50"] <= 0.6)
check("256 clients x one 128-token sentence >= 60,000/s", ("long-k1", 256), lambda p: p["sentences_per_s"] >= 60000)
check("64 clients x 32 short >= 220,000/s with 0 errors", ("bulk-k32", 64),
      lambda p: p["sentences_per_s"] >= 220000 and p["errors"] == 0)
PY
