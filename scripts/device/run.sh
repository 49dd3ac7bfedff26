#!/usr/bin/env bash
# The measurements behind bench/results/, on a GPU machine, in one device call.
#
#   scripts/device/run.sh STEP...        (from the repository root; steps run in the order given)
#
# The GPU machine has no Rust toolchain: build here, put what the steps need in one folder, send
# it with the call (the device tool's `carry`), and run this script there. The folder (D,
# default .dev) may hold, each binary plain or xz-compressed (NAME.xz), stripped:
#
#   $D/streampool               the CLI: cargo build --release -p streampool-cli --features cuda
#                               (add wgpu for the wgpu step)
#   $D/before                   optional: an older CLI; `forward`, `served` and `cpu` then run it
#                               interleaved with the new one (same call, same machine)
#   $D/minilm-fp16/             all-MiniLM-L6-v2 in fp16 (scripts/make_fp16_minilm.py); its
#                               model.safetensors may be .xz. Or, where the weights and the
#                               binaries do not fit one carry: $D/minilm-shape/ (that folder
#                               without model.safetensors) and $D/minilm-header.bin (the
#                               safetensors header: its first 8 + N bytes, N the little-endian
#                               u64 in its first 8); the steps then run random weights of those
#                               names, shapes and dtypes (speed only: same kernels, same shapes)
#   $D/tests/NAME               test binaries (cargo test --release --no-run ...): each crate has
#                               one, `it` (its modules: `it cuda::`, `it wgpu::`); name the runtime's
#                               `it`, streampool-nn's `nn-it`, and the runtime's unit tests `lib`
#   $D/examples/NAME            forward_timeline, minilm_phases (streampool-nn), host_cost,
#                               cuda_profile, wgpu_bench, cpu_gemm (streampool)
#   $D/kernels-before.cu        optional (first-use): an older kernels.cu, timed as one NVRTC program
#   $D/wheel/*.whl              the Python package (python step): maturin build --release --features cuda
#   $D/gl/*.deb                 the Vulkan loader's Debian packages (wgpu step; or GL=DIR)
#
# Steps:
#   tests      every test binary in $D/tests (or those TESTS names, a glob), each from its crate's
#              folder (TEST_ARGS: a filter and flags), then compute-sanitizer's SANITIZE tools
#              (default none; e.g. "memcheck racecheck synccheck") on SANITIZE_TEST of `cuda`
#   forward    MiniLM forward (`bench --scenarios forward`: upload, forward, pool, read-back),
#              ROUNDS runs of ours (each after one of $D/before if present), then PyTorch eager
#              and torch.compile on the same points (bench/torch_baseline.py --compiled-only) and
#              bench/compare.py --compiled for each of our runs
#   timeline   forward_timeline: where one call's time goes, per shape (TIMELINE_SHAPES)
#   ncu        Nsight Compute kernel table of the forward per shape (NCU_SHAPES), summed by
#              scripts/device/ncu_summary.py over the last forwards only
#   dtypes     ours per dtype (DTYPES, default f32,tf32,f16,bf16) against PyTorch's forward per
#              dtype and sentence-transformers, then bench/compare.py --dtypes; DTYPES=f32 is the
#              fp32 (TF32 off) check
#   host-cost  per-op host cost (host_cost example: our op, the driver's floor, 1..64 threads),
#              the bench's overhead point and MLP threading, cuda_profile's phases
#   served     `serve` pinned to SERVER_CORES under `loadgen` on LG_CORES: the pre-tokenized
#              forward first (the ceiling the served figures are set against), then POINTS
#              (below) for SERVED_ROUNDS rounds (old and new interleaved when $D/before is
#              there), then with PHASES=1 a --phase-timing server; a table prints last
#   first-use  a new machine's start: the older kernels.cu through NVRTC, `serve` launch to ready
#              (scripts/device/coldstart.py), `streampool first-use` rows (empty caches, NVRTC
#              fallback, no shape buckets, warm machine, per shape), and `serve`'s first seconds
#              under load against its steady state
#   cpu        the CPU device on the machine's host: ROUNDS rounds of ours (and before) and
#              PyTorch eager f32 with sentence-transformers (bench/torch_baseline.py --device
#              cpu), the medians of the per-round ratios, then STREAMPOOL_CPU_PROFILE=1 of one
#              point; ONNX=1 adds ONNX Runtime (scripts/device/onnx_cpu.py)
#   cpu-scan   the cpu_gemm example (MiniLM's products and attention one at a time) at 1..16
#              pool threads and under each SCAN setting, ROUNDS interleaved rounds
#   wgpu       through the Vulkan driver: `check`, the wgpu suite (STREAMPOOL_WGPU_COOP_MATRIX
#              as COOP) and WGPU_PARALLEL copies at once, the matmul table (wgpu_bench: FMA and
#              matrix-unit kernels next to cuBLAS), MiniLM f16 forward FMA against matrix units
#              (ROUNDS; the older CLI's too, when carried) and CUDA, the GPU profile per kernel
#              and the walls without it, the MLP batch-1 call floor, and the streampool-nn wgpu
#              suite with the real model (WGPU_PARTS picks)
#   python     bench/python_embedder.py: the Python package from N threads against
#              sentence-transformers
#
# Variables: D, OUT (default bench/results/latest), MODEL (a model folder instead of $D's),
# SECS (per point, 1.5), ROUNDS (3), DEADLINE (seconds from the start after which a long part is
# skipped, and says so; default 570), SITE (the Python site-packages with the CUDA 13 wheels),
# CUDA_HOME (/usr/local/cuda), WORK (where binaries are unpacked: /tmp/streampool-run, kept on a
# warm machine, so a second call can use the first call's binaries), BUILD_ROOT (the absolute
# path the test binaries were built in: linked to this checkout, as they read their data files
# from there). Each step's own variables are at its function below.
set -uo pipefail
cd "$(dirname "$0")/../.."
[ $# -gt 0 ] || {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
}
D=${D:-.dev}
OUT=${OUT:-bench/results/latest}
WORK=${WORK:-/tmp/streampool-run}
SITE=${SITE:-/opt/torch/.venv/lib/python3.12/site-packages}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
SECS=${SECS:-1.5}
ROUNDS=${ROUNDS:-3}
DEADLINE=${DEADLINE:-570}
export LD_LIBRARY_PATH=$SITE/nvidia/cu13/lib:$CUDA_HOME/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=$CUDA_HOME/bin:$PATH PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK/tests" "$WORK/examples"
SUMMARY=$OUT/summary.txt
T0=$(date +%s)

stamp() { echo "[$(($(date +%s) - T0)) s] $*"; }
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
# room NAME SECONDS: false (and a line in the summary) when fewer than SECONDS are left.
room() {
    if [ "$(left)" -lt "$2" ]; then
        stamp "skipped $1: $(left) s left" | tee -a "$SUMMARY"
        return 1
    fi
}
note() { echo "$*" | tee -a "$SUMMARY"; }

# unpack SRC DST: SRC or SRC.xz to DST (executable); false when neither exists.
unpack() {
    if [ -f "$1.xz" ]; then
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
            "$1.xz" "$2" || return 1
    elif [ -f "$1" ]; then
        cp "$1" "$2" || return 1
    else
        return 1
    fi
    chmod +x "$2"
}

# Binaries: unpacked once into $WORK, where a warm machine keeps them between calls.
for b in streampool before; do
    [ -x "$WORK/$b" ] && [ ! -e "$D/$b" ] && [ ! -e "$D/$b.xz" ] && continue
    unpack "$D/$b" "$WORK/$b" 2>/dev/null || true
done
for kind in tests examples; do
    for f in "$D/$kind"/*; do
        [ -f "$f" ] || continue
        name=$(basename "$f" .xz)
        unpack "$D/$kind/$name" "$WORK/$kind/$name"
    done
done
CLI=$WORK/streampool
BEFORE=$WORK/before
[ -x "$BEFORE" ] || BEFORE=
if [ -n "${BUILD_ROOT:-}" ] && [ "$BUILD_ROOT" != "$PWD" ]; then
    mkdir -p "$(dirname "$BUILD_ROOT")" && ln -sfn "$PWD" "$BUILD_ROOT"
fi

# The model: MODEL, else $D/minilm-fp16 (weights unpacked), else random weights of
# $D/minilm-header.bin's names, shapes and dtypes (with the folder's other files, if any, in
# $D/minilm-shape/).
model() {
    M=${MODEL:-}
    [ -n "$M" ] && return 0
    M=$WORK/minilm
    [ -f "$M/model.safetensors" ] && return 0
    mkdir -p "$M"
    if [ -d "$D/minilm-fp16" ]; then
        cp -r "$D/minilm-fp16/." "$M/"
        if [ -f "$M/model.safetensors.xz" ]; then
            unpack "$M/model.safetensors" "$M/model.safetensors.tmp" &&
                mv "$M/model.safetensors.tmp" "$M/model.safetensors" && rm "$M/model.safetensors.xz"
            chmod -x "$M/model.safetensors"
        fi
    elif [ -f "$D/minilm-header.bin" ]; then
        [ -d "$D/minilm-shape" ] && cp -r "$D/minilm-shape/." "$M/"
        python3 - "$D/minilm-header.bin" "$M/model.safetensors" <<'PY'
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
rng = np.random.default_rng(0)
end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
data = bytearray(end)
for k, v in header.items():
    if k == "__metadata__":
        continue
    a, b = v["data_offsets"]
    shape = v["shape"]
    if v["dtype"] == "I64":
        x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    elif k.endswith("LayerNorm.weight"):
        x = np.ones(shape, np.float16)
    elif k.endswith("bias"):
        x = np.zeros(shape, np.float16)
    else:
        x = (rng.standard_normal(shape) * 0.05).astype(np.float16)
    assert x.nbytes == b - a, k
    data[a:b] = x.tobytes()
open(sys.argv[2], "wb").write(raw[:8 + n] + bytes(data))
PY
        note "model: random weights with MiniLM's shapes (speed only)"
    else
        echo "no model: set MODEL or carry $D/minilm-fp16" >&2
        return 1
    fi
}

# bench NAME BINARY ARGS...: one `streampool bench` run into $OUT/NAME, its point lines printed.
bench() {
    local name=$1 bin=$2
    shift 2
    timeout "${BENCH_TIMEOUT:-150}" "$bin" bench --out "$OUT/$name" "$@" >"$OUT/$name.log" 2>&1
    note "$name: exit $? $(grep -E '^  (minilm|mlp)' "$OUT/$name.log" | sed 's/^ *//; s/, p99.*//' | tr '\n' ';')"
}

# The GPU, the host and the commit, once.
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv,noheader 2>&1
    lscpu 2>/dev/null | grep -E "Model name|^CPU\(s\)|Thread|L1d|L2"
    git log -1 --format='tree at %h %s' 2>/dev/null
} >"$OUT/machine.txt"

# --- tests -----------------------------------------------------------------------------
# TESTS (glob over $D/tests names, default all), TEST_ARGS (default --test-threads 4),
# SANITIZE (compute-sanitizer tools), SANITIZE_TEST (default mean_pool_matches_the_cpu_backend).
step_tests() {
    export STREAMPOOL_MINILM_DIR=${STREAMPOOL_MINILM_DIR:-$(model >/dev/null 2>&1 && echo "$M")}
    local t name dir
    for t in "$WORK"/tests/${TESTS:-*}; do
        [ -x "$t" ] || continue
        name=$(basename "$t")
        case $name in nn-*) dir=crates/streampool-nn ;; *) dir=crates/streampool ;; esac
        room "test $name" 30 || continue
        # shellcheck disable=SC2086
        (cd "$dir" && timeout 300 "$t" ${TEST_ARGS:---test-threads 4}) >"$OUT/test-$name.log" 2>&1
        note "test $name: exit $? $(grep -E '^test result' "$OUT/test-$name.log" | tail -1)"
        grep -hE "cosine" "$OUT/test-$name.log" | head -6
    done
    local tool test=${SANITIZE_TEST:-mean_pool_matches_the_cpu_backend}
    for tool in ${SANITIZE:-}; do
        room "compute-sanitizer $tool" 40 || continue
        (cd crates/streampool && timeout 150 compute-sanitizer --tool "$tool" "$WORK/tests/it" "cuda::$test" \
            --test-threads 1 --nocapture) >"$OUT/sanitize-$tool.log" 2>&1
        note "$tool $test: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result|Internal' \
            "$OUT/sanitize-$tool.log" | tr '\n' ' ')"
    done
}

# --- forward ---------------------------------------------------------------------------
# WORKLOADS (minilm32,minilm128,minilm256,minilm512,minilm-mix), BATCHES (64,512), DTYPE (f16),
# COMPILE_MODES (reduce-overhead,default,eager; empty: no PyTorch), DEVICE (cuda).
step_forward() {
    model || return
    local w=${WORKLOADS:-minilm32,minilm128,minilm256,minilm512,minilm-mix} b=${BATCHES:-64,512}
    local args=(--device "${DEVICE:-cuda}" --minilm "$M" --dtype "${DTYPE:-f16}" --workloads "$w"
        --scenarios forward --forward-batches "$b" --seconds "$SECS")
    local r
    for r in $(seq 1 "$ROUNDS"); do
        if [ -n "$BEFORE" ] && room "before-$r" 60; then
            STREAMPOOL_CUBLASLT_TUNE_LOG=1 bench "before-$r" "$BEFORE" "${args[@]}"
        fi
        room "ours-$r" 60 && STREAMPOOL_CUBLASLT_TUNE_LOG=1 bench "ours-$r" "$CLI" "${args[@]}"
    done
    [ -n "${COMPILE_MODES-reduce-overhead,default,eager}" ] || return 0
    room torch 90 || return 0
    local seqs mix=()
    seqs=$(echo "$w" | tr ',' '\n' | sed -n 's/^minilm\([0-9][0-9]*\)$/\1/p' | paste -sd, -)
    [[ ",$w," == *",minilm-mix,"* ]] && mix=(--mix)
    export TORCHINDUCTOR_CACHE_DIR=$WORK/inductor
    timeout $(($(left) - 20)) python3 bench/torch_baseline.py --device "${DEVICE:-cuda}" --minilm "$M" \
        --compiled-only --compile-modes "${COMPILE_MODES:-reduce-overhead,default,eager}" \
        --compile-dtype "${DTYPE:-f16}" --mask-variants mask "${mix[@]}" --compile-seqs "$seqs" \
        --forward-batches "$b" --seconds "$SECS" --out "$OUT/torch" >"$OUT/torch.log" 2>&1
    note "torch: exit $?"
    for r in $(seq 1 "$ROUNDS"); do
        [ -f "$OUT/ours-$r/streampool.json" ] || continue
        python3 bench/compare.py --compiled "$OUT/ours-$r/streampool.json" "$OUT/torch/pytorch-compiled.jsonl" \
            >"$OUT/table-ours-$r.md" 2>&1
        grep -E "^\| minilm" "$OUT/table-ours-$r.md" | sed "s/^/ours-$r /" | tee -a "$SUMMARY"
    done
}

# --- timeline --------------------------------------------------------------------------
# TIMELINE_SHAPES (BATCHxSEQ list, default "512x128 64x128 512x32"); the environment of the
# call applies (e.g. STREAMPOOL_CUBLASLT_RESIDUAL=off to compare).
step_timeline() {
    model || return
    local s
    for s in ${TIMELINE_SHAPES:-512x128 64x128 512x32}; do
        room "timeline $s" 30 || continue
        timeout 120 "$WORK/examples/forward_timeline" "$M" --device cuda --dtype "${DTYPE:-f16}" \
            --batch "${s%x*}" --seq "${s#*x}" --iters 60 2>&1 | sed "s/^/$s /" | tee -a "$OUT/timeline.txt"
    done
}

# --- ncu -------------------------------------------------------------------------------
# NCU_SHAPES (default "512x128"); clocks are left free (--clock-control none).
step_ncu() {
    model || return
    local s
    for s in ${NCU_SHAPES:-512x128}; do
        room "ncu $s" 60 || continue
        timeout 200 ncu --clock-control none --csv --metrics gpu__time_duration.sum \
            "$WORK/examples/forward_timeline" "$M" --device cuda --dtype "${DTYPE:-f16}" \
            --batch "${s%x*}" --seq "${s#*x}" --loop-forward 6 >"$OUT/ncu-$s.csv" 2>&1
        python3 scripts/device/ncu_summary.py "$OUT/ncu-$s.csv" 3 --tail >"$OUT/ncu-$s.txt" 2>&1
        head -16 "$OUT/ncu-$s.txt"
    done
}

# --- dtypes ----------------------------------------------------------------------------
# DTYPES (f32,tf32,f16,bf16), DTYPE_SCENARIOS (forward,ceiling), BATCHES (64,512).
step_dtypes() {
    model || return
    local dt=${DTYPES:-f32,tf32,f16,bf16} b=${BATCHES:-64,512}
    bench ours-dtypes "$CLI" --device cuda --minilm "$M" --dtypes "$dt" --workloads minilm32,minilm128 \
        --scenarios "${DTYPE_SCENARIOS:-forward,ceiling}" --forward-batches "$b" --ceiling-batches "$b" \
        --seconds "$SECS"
    room "torch dtypes" 60 || return 0
    timeout $(($(left) - 20)) python3 bench/torch_baseline.py --device cuda --minilm "$M" --dtype-only \
        --dtypes "$dt" --workloads minilm32,minilm128 --forward-batches "$b" --seconds "$SECS" \
        --out "$OUT/torch-dtypes" >"$OUT/torch-dtypes.log" 2>&1
    note "torch dtypes: exit $?"
    python3 bench/compare.py --dtypes "$OUT/ours-dtypes/streampool.json" "$OUT/torch-dtypes/pytorch.json" \
        >"$OUT/compare-dtypes.md" 2>&1
    tail -12 "$OUT/compare-dtypes.md"
}

# --- host-cost -------------------------------------------------------------------------
step_host_cost() {
    local pass
    for pass in 1 2; do  # the first pass also warms the driver and the GPU's clocks
        HOST_COST_DEVICE=cuda timeout 120 "$WORK/examples/host_cost" perop driver >>"$OUT/host_cost.log" 2>&1
    done
    HOST_COST_DEVICE=cuda timeout 120 "$WORK/examples/host_cost" threads >"$OUT/host_cost_threads.log" 2>&1
    [ -x "$WORK/examples/cuda_profile" ] &&
        PROFILE_MODES=eager timeout 120 "$WORK/examples/cuda_profile" units phases >"$OUT/cuda_profile.log" 2>&1
    bench mlp "$CLI" --device cuda --workloads mlp --scenarios threading,overhead --threads 1,2,4,8,16,32,64
    tail -8 "$OUT/host_cost.log"
}

# --- served ----------------------------------------------------------------------------
# POINTS (names below; default "lat short long bulk b64 tei"), SERVED_ROUNDS (1), DEVICE (cuda;
# cuda:all for every GPU), DTYPE (f16), SERVER_CORES (0-11), LG_CORES (12-15), DURATION (8),
# WARMUP (2), PHASES (1: a --phase-timing pass after), SERVED_FORWARD (1: the forward first),
# PORT (18090).
point_args() {
    case $1 in
    lat) echo "-c 1 -k 1 --corpus short" ;;
    short) echo "-c 1,16,64,256 -k 1 --corpus short" ;;
    long) echo "-c 256 -k 1 --corpus long" ;;
    long-curve) echo "-c 1,16,64,256 -k 1 --corpus long" ;;
    bulk) echo "-c 16,32,64,128,256,512 -k 32 --corpus short --until-errors" ;;
    bulk64) echo "-c 64 -k 32 --corpus short" ;;
    b64) echo "-c 64 -k 32 --corpus short --encoding base64" ;;
    tei) echo "-c 64 -k 32 --corpus short --route tei" ;;
    mix) echo "-c 64 -k 16 --corpus mixed --encoding base64" ;;
    mix-float) echo "-c 64 -k 16 --corpus mixed" ;;
    *) echo "unknown point $1" >&2; return 1 ;;
    esac
}
pin() {
    local cores=$1
    shift
    if command -v taskset >/dev/null; then taskset -c "$cores" "$@"; else "$@"; fi
}
step_served() {
    model || return
    local sc=${SERVER_CORES:-0-11} lc=${LG_CORES:-12-15} port=${PORT:-18090} dev=${DEVICE:-cuda}
    local s=$OUT/served
    mkdir -p "$s"
    if [ "${SERVED_FORWARD:-1}" = 1 ]; then
        pin "$sc" "$CLI" bench --device "${dev%%:*}" --minilm "$M" --dtype "${DTYPE:-f16}" \
            --workloads minilm16,minilm128,minilm-mix --scenarios forward --forward-batches 1,32,64,512 \
            --seconds "$SECS" --out "$s/forward" >"$s/forward.log" 2>&1
    fi
    local builds=(new) r b bin srv p
    [ -n "$BEFORE" ] && builds=(old new)
    serve_and_load() {  # build bin tag extra-serve-flags...
        local build=$1 bin=$2 tag=$3
        shift 3
        # Started directly, not through a shell function, so that $! is the server's own pid
        # (taskset execs it in place).
        if command -v taskset >/dev/null; then
            taskset -c "$sc" "$bin" serve --device "$dev" --dtype "${DTYPE:-f16}" --model "$M" --port "$port" \
                "$@" >"$s/server-$build-$tag.log" 2>&1 &
        else
            "$bin" serve --device "$dev" --dtype "${DTYPE:-f16}" --model "$M" --port "$port" "$@" \
                >"$s/server-$build-$tag.log" 2>&1 &
        fi
        srv=$!
        pin "$lc" "$bin" loadgen --url "http://127.0.0.1:$port" --wait-ready 120 --requests 1 --warmup 0 >/dev/null
        for p in ${POINTS:-lat short long bulk b64 tei}; do
            # shellcheck disable=SC2046
            pin "$lc" "$bin" loadgen --url "http://127.0.0.1:$port" --server-pid "$srv" \
                --tokenizer "$M/tokenizer.json" --warmup "${WARMUP:-2}" --duration "${DURATION:-8}" \
                --json "$s/$p-$build-$tag.json" $(point_args "$p") >>"$s/loadgen.log" 2>&1
        done
        kill -TERM "$srv" 2>/dev/null
        wait "$srv" 2>/dev/null
    }
    for r in $(seq 1 "${SERVED_ROUNDS:-1}"); do
        for b in "${builds[@]}"; do
            room "served $b round $r" 60 || continue
            bin=$CLI
            [ "$b" = old ] && bin=$BEFORE
            serve_and_load "$b" "$bin" "r$r"
        done
    done
    if [ "${PHASES:-1}" = 1 ] && room "served phases" 60; then
        POINTS="long bulk64 lat" serve_and_load new "$CLI" phases --phase-timing
    fi
    python3 - "$s" <<'PY' | tee "$OUT/served.md"
import glob, json, os, statistics, sys
s = sys.argv[1]
fwd = {}
try:
    for r in json.load(open(f"{s}/forward/streampool.json"))["results"]:
        if r["scenario"] == "forward":
            fwd[(r["workload"], r["batch"])] = r["throughput_per_s"]
except Exception as e:
    print(f"(no forward figures: {e})")
if fwd:
    print("forward, pre-tokenized (sentences/s): " + ", ".join(
        f"{k[0]} b{k[1]} {v:,.0f}" for k, v in sorted(fwd.items())))
ref = {"long": ("minilm128", 512), "short": ("minilm16", 512), "mixed": ("minilm-mix", 512)}
rows = {}
for path in sorted(glob.glob(f"{s}/*.json")):
    point, build, tag = os.path.basename(path)[:-5].rsplit("-", 2)
    for p in json.load(open(path))["points"]:
        srv = p.get("server") or {}
        key = (point, p["concurrency"], build, tag == "phases")
        rows.setdefault(key, []).append(p)
        if srv.get("phases"):
            print(f"{point} c={p['concurrency']} {build} host phases, mean us: " + ", ".join(
                f"{k} {v['mean_us']:.1f}" for k, v in srv["phases"].items()))
print()
print("| point | conns | build | sentences/s (rounds) | median | of forward b512 | p50 ms (median) | p99 ms (median) | errors | loadgen cores |")
print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|")
for (point, conns, build, phases), ps in sorted(rows.items()):
    tp = [p["sentences_per_s"] for p in ps]
    f = fwd.get(ref.get(ps[0]["corpus"], ("", 0)))
    med = statistics.median(tp)
    print(f"| {point}{' (phase timing)' if phases else ''} | {conns} | {build} | "
          f"{', '.join(f'{x:,.0f}' for x in tp)} | {med:,.0f} | {f'{med / f:.1%}' if f else '-'} | "
          f"{statistics.median(p['latency_ms']['p50'] for p in ps):.3f} | "
          f"{statistics.median(p['latency_ms']['p99'] for p in ps):.3f} | {sum(p['errors'] for p in ps)} | "
          f"{statistics.median(p['loadgen_cpu']['cores'] for p in ps):.2f} |")
PY
}

# --- first-use -------------------------------------------------------------------------
# Needs the model as $D/minilm-fp16 and the CLI built with the sm_80/sm_90 cubins embedded
# (STREAMPOOL_NVRTC pointing at an NVRTC at build time, docs/cuda.md).
step_first_use() {
    model || return
    local w=$WORK/first-use log=$OUT/first-use.log
    rm -rf "$w" && mkdir -p "$w"
    if [ -f "$D/kernels-before.cu" ]; then
        python3 - "$D/kernels-before.cu" <<'PY' 2>&1 | tee -a "$log"
import ctypes, subprocess, sys, time
lib = ctypes.CDLL("libnvrtc.so.13")
cc = subprocess.run(["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader"],
                    capture_output=True, text=True).stdout.split()[0].replace(".", "")
src = open(sys.argv[1], "rb").read()
prog = ctypes.c_void_p()
t = time.monotonic()
assert lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"k.cu", 0, None, None) == 0
opt = [f"--gpu-architecture=sm_{cc}".encode()]
rc = lib.nvrtcCompileProgram(prog, 1, (ctypes.c_char_p * 1)(*opt))
print(f"before: the whole kernels.cu as one NVRTC program for sm_{cc}: rc {rc}, "
      f"{time.monotonic() - t:.2f} s")
PY
    fi
    # Launch to ready: first start on the machine, warm caches, cache off, PTX forced.
    python3 scripts/device/coldstart.py --bin "$CLI" --model "$M" --out "$OUT" --work "$w/cold" \
        ${BEFORE:+--baseline "$BEFORE"} 2>&1 | tail -n 25 | tee -a "$log"
    row() {
        local name=$1
        shift
        echo "== $name: first-use $*" | tee -a "$log"
        timeout 200 "$CLI" first-use --model "$M" --json "$w/$name.json" "$@" 2>&1 | tee -a "$log" | tail -3
    }
    row new-machine --kernel-cache "$w/kc-a"
    row new-machine-tune-in-pass --kernel-cache "$w/kc-e" --warm-up-tokens 0
    row nvrtc-fallback --kernel-cache "$w/kc-b" --embedded-kernels false --passes 3
    row no-buckets --kernel-cache "$w/kc-c" --buckets 0 --warm-up-tokens 0
    row warm-machine --kernel-cache "$w/kc-a" --seed 2
    row per-shape --kernel-cache "$w/kc-d" --buckets 0 --warm-up-tokens 0 --passes 1 --texts 256 \
        --per-shape 6 --seed 3
    # `serve`'s first seconds after ready against its steady state: fresh caches, then warm.
    local name pid
    for name in fresh warm; do
        STREAMPOOL_CACHE_DIR=$w/kernel-cache "$CLI" serve --device cuda --model "$M" --port 18400 \
            >"$w/serve-$name.log" 2>&1 &
        pid=$!
        "$CLI" loadgen --url http://127.0.0.1:18400 --corpus long -c 256 --warmup 0 --tokenizer "$M" \
            --wait-ready 120 --duration 3 --server-pid $pid --json "$w/seconds-$name-first.json" >/dev/null 2>&1
        "$CLI" loadgen --url http://127.0.0.1:18400 --corpus long -c 256 --warmup 0 --tokenizer "$M" \
            --duration 6 --server-pid $pid --json "$w/seconds-$name-steady.json" >/dev/null 2>&1
        grep -a "startup:" "$w/serve-$name.log" | tail -n 1 | tee -a "$log"
        kill $pid
        wait $pid
    done
    python3 - "$w" "$OUT" <<'PY' | tee -a "$log"
import json, pathlib, sys
w, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
rows = {p.stem: json.loads(p.read_text()) for p in sorted(w.glob("*.json")) if not p.stem.startswith("seconds-")}
json.dump(rows, open(out / "first-use.json", "w"), indent=1)
print("row                       ready s  first texts/s  steady texts/s  first/steady")
for name, r in rows.items():
    print(f"{name:25} {r['startup']['ready_s']:7.2f}  {r['first_pass_texts_per_s']:13.0f}  "
          f"{r['steady_texts_per_s']:14.0f}  {100 * r['first_over_steady']:11.1f}%")
secs = {p.stem[len("seconds-"):]: json.loads(p.read_text()) for p in sorted(w.glob("seconds-*.json"))}
json.dump(secs, open(out / "served-first-seconds.json", "w"), indent=1)
print("serve  window        sent/s     p50 ms   p99 ms")
for name, r in secs.items():
    p = r["points"][0]
    print(f"{name:21} {p.get('sentences_per_s', 0):12.0f} {p['latency_ms']['p50']:9.2f} {p['latency_ms']['p99']:8.2f}")
PY
}

# --- cpu -------------------------------------------------------------------------------
# CPU_WORKLOADS (minilm32,minilm128), CPU_BATCHES (1,64), CPU_SCENARIOS (forward,ceiling),
# CPU_DTYPES (f32), CPU_BENCH_ARGS (more bench flags, e.g. "--threads 1,16 --max-batch 16
# --max-wait-ms 0" with CPU_SCENARIOS=forward,batching), TORCH (1: PyTorch and
# sentence-transformers each round), ONNX (0), PROFILE (1).
step_cpu() {
    model || return
    local w=${CPU_WORKLOADS:-minilm32,minilm128} b=${CPU_BATCHES:-1,64} r
    local args=(--device cpu --minilm "$M" --workloads "$w" --forward-batches "$b" --ceiling-batches 64
        --dtypes "${CPU_DTYPES:-f32}" --seconds "${SECS}")
    lscpu | grep -E "Model name|^CPU\(s\)|Thread|L1d|L2" >"$OUT/host.txt"
    grep -o -w -E "avx512f|avx512_bf16|avx512_vnni|amx_bf16|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' ' >>"$OUT/host.txt"
    for r in $(seq 1 "$ROUNDS"); do
        room "cpu round $r" 60 || break
        # shellcheck disable=SC2086
        [ -n "$BEFORE" ] && bench "cpu-before-$r" "$BEFORE" "${args[@]}" --scenarios forward ${CPU_BENCH_ARGS:-}
        # shellcheck disable=SC2086
        bench "cpu-ours-$r" "$CLI" "${args[@]}" --scenarios "${CPU_SCENARIOS:-forward,ceiling}" ${CPU_BENCH_ARGS:-}
        if [ "${TORCH:-1}" = 1 ]; then
            timeout 300 python3 bench/torch_baseline.py --device cpu --workloads "$w" --dtypes "${CPU_DTYPES:-f32}" \
                --dtype-only --forward-batches "$b" --seconds "$SECS" --minilm "$M" --out "$OUT/cpu-torch-$r" \
                >"$OUT/cpu-torch-$r.log" 2>&1
            python3 bench/cpu_compare.py "$OUT/cpu-ours-$r/streampool.json" "$OUT/cpu-torch-$r/pytorch.json" \
                >"$OUT/cpu-compare-$r.md" 2>&1
        fi
    done
    if [ "${TORCH:-1}" = 1 ]; then
        python3 - "$OUT" "$ROUNDS" <<'PY' | tee "$OUT/cpu-medians.md"
import json, os, statistics, sys
out, n = sys.argv[1], int(sys.argv[2])
def pts(path):
    if not os.path.exists(path):
        return {}
    return {(r["workload"], r["scenario"], r["batch"]): r["throughput_per_s"]
            for r in json.load(open(path))["results"] if (r.get("dtype") or "f32") == "f32"}
rows = {}
for i in range(1, n + 1):
    o, t = pts(f"{out}/cpu-ours-{i}/streampool.json"), pts(f"{out}/cpu-torch-{i}/pytorch.json")
    b = pts(f"{out}/cpu-before-{i}/streampool.json")
    for k, v in o.items():
        if k in t:
            rows.setdefault(k, []).append((v, t[k], b.get(k)))
print("| workload | scenario | batch | ours per round | before per round | PyTorch per round | ours / PyTorch per round | median | before / PyTorch median | ours / before median |")
print("|---|---|---:|---|---|---|---|---:|---:|---:|")
f = lambda xs: ", ".join(f"{x:,.1f}" for x in xs)
med = lambda xs: f"{statistics.median(xs):.2f}x" if xs else "-"
for k in sorted(rows):
    v = rows[k]
    r = [a / t for a, t, _ in v]
    print(f"| {k[0]} | {k[1]} | {k[2]} | {f(a for a, _, _ in v)} | {f(b for _, _, b in v if b) or '-'} | "
          f"{f(t for _, t, _ in v)} | {', '.join(f'{x:.2f}x' for x in r)} | **{med(r)}** | "
          f"{med([b / t for _, t, b in v if b])} | {med([a / b for a, _, b in v if b])} |")
PY
    fi
    if [ "${PROFILE:-1}" = 1 ] && room "cpu profile" 30; then
        STREAMPOOL_CPU_PROFILE=1 bench cpu-profile "$CLI" --device cpu --minilm "$M" --workloads minilm32 \
            --forward-batches 64 --scenarios forward --dtypes f32 --seconds 1
    fi
    if [ "${ONNX:-0}" = 1 ] && room onnx 60; then
        timeout 240 python3 scripts/device/onnx_cpu.py "$M" "$OUT/onnx" "$SECS" >"$OUT/onnx.log" 2>&1
        note "onnx: exit $?"
    fi
}

# --- cpu-scan --------------------------------------------------------------------------
# SCAN: settings, each ENV=VALUE[,ENV=VALUE] or "default"; the thread counts 1..16 first.
step_cpu_scan() {
    local r t s
    local settings=${SCAN:-"default STREAMPOOL_CPU_SGEMM_SCHED=pieces STREAMPOOL_CPU_SGEMM_KC=192 STREAMPOOL_CPU_SGEMM_KC=256 STREAMPOOL_CPU_SGEMM_UNITS=8 STREAMPOOL_CPU_ATTENTION=gemm"}
    for t in 1 2 4 8 16; do
        STREAMPOOL_CPU_THREADS=$t CPU_GEMM_REPS=$((t < 4 ? 5 : 20)) timeout 120 "$WORK/examples/cpu_gemm" 2>&1 |
            sed "s/^/[threads $t] /" >>"$OUT/cpu-scan.log"
    done
    for r in $(seq 1 "$ROUNDS"); do
        for s in $settings; do
            room "scan $s" 20 || break 2
            # shellcheck disable=SC2046
            env $( [ "$s" = default ] || echo "$s" | tr ',' ' ') timeout 120 "$WORK/examples/cpu_gemm" 2>&1 |
                sed "s/^/[$s r$r] /" >>"$OUT/cpu-scan.log"
        done
    done
    grep -E "GFLOP" "$OUT/cpu-scan.log" | tail -20
}

# --- wgpu ------------------------------------------------------------------------------
# WGPU_PARTS (check,suite,matmul,forward,profile,mlp,nn), COOP (the suite's
# STREAMPOOL_WGPU_COOP_MATRIX: 1 on, 0 off, unset: the adapter's default), WGPU_PARALLEL (2:
# copies of the suite at once), WGPU_MATMUL_ARGS (wgpu_bench matmul's flags; default f16, FMA
# and matrix units at four forced tiles, cuBLAS), WGPU_MATMUL_BLOCKS (its --blocks, the FMA
# tiles; set empty for none), GL.
step_wgpu() {
    local gl=${GL:-$D/gl} f
    for f in "$gl"/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done
    ldconfig 2>/dev/null
    export VK_DRIVER_FILES=${VK_DRIVER_FILES:-/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json} XDG_RUNTIME_DIR=/tmp
    local parts=,${WGPU_PARTS:-check,suite,matmul,forward,profile,mlp,nn}, i r v c
    has() { [[ $parts == *",$1,"* ]]; }
    if has check; then
        timeout 60 "$CLI" check --device wgpu >"$OUT/wgpu-check.log" 2>&1
        STREAMPOOL_WGPU_COOP_MATRIX=1 timeout 60 "$CLI" check --device wgpu >"$OUT/wgpu-check-coop.log" 2>&1
        grep -E "matmul F16|cooperative" "$OUT/wgpu-check-coop.log" | head -12
    fi
    if has suite && [ -x "$WORK/tests/it" ]; then
        (
            [ -n "${COOP:-}" ] && export STREAMPOOL_WGPU_COOP_MATRIX=$COOP
            cd crates/streampool || exit
            timeout 150 "$WORK/tests/it" wgpu --nocapture >"$OUT/wgpu-tests.log" 2>&1
            echo "wgpu suite: exit $? $(grep 'test result' "$OUT/wgpu-tests.log")"
            for i in $(seq 1 "${WGPU_PARALLEL:-2}"); do
                timeout 150 "$WORK/tests/it" wgpu >"$OUT/wgpu-tests-parallel-$i.log" 2>&1 &
            done
            wait
            grep -h "test result" "$OUT"/wgpu-tests-parallel-*.log
        ) | tee -a "$SUMMARY"
    fi
    if has matmul && [ -x "$WORK/examples/wgpu_bench" ] && room "wgpu matmul" 60; then
        # shellcheck disable=SC2206
        local margs=(${WGPU_MATMUL_ARGS:---dtypes f16 --coop --coop-blocks 64x64x32,128x64x32,64x128x32,128x128x32 --cuda --secs 0.25})
        [ -n "${WGPU_MATMUL_BLOCKS+set}" ] && margs+=(--blocks "$WGPU_MATMUL_BLOCKS")
        timeout 400 "$WORK/examples/wgpu_bench" matmul "${margs[@]}" >"$OUT/wgpu-matmul.md" 2>"$OUT/wgpu-matmul.err"
        tail -14 "$OUT/wgpu-matmul.md"
    fi
    if has forward && model; then
        local fwd=(--device wgpu --dtype f16 --minilm "$M" --workloads minilm32,minilm128 --scenarios forward
            --forward-batches 64,512 --seconds 1)
        for r in $(seq 1 "$ROUNDS"); do
            if [ -n "$BEFORE" ] && room "wgpu forward before $r" 40; then
                STREAMPOOL_WGPU_COOP_MATRIX=0 bench "wgpu-before-$r" "$BEFORE" "${fwd[@]}"
            fi
            for v in fma coop; do
                c=0
                [ $v = coop ] && c=1
                room "wgpu forward $v $r" 40 || continue
                STREAMPOOL_WGPU_COOP_MATRIX=$c bench "wgpu-$v-$r" "$CLI" "${fwd[@]}"
            done
        done
        bench cuda-f16 "$CLI" --device cuda --dtype f16 --minilm "$M" --workloads minilm32,minilm128 \
            --scenarios forward --forward-batches 64,512 --seconds 1
    fi
    if has profile && [ -x "$WORK/examples/minilm_phases" ] && model; then
        for v in fma coop; do
            c=0
            [ $v = coop ] && c=1
            room "wgpu profile $v" 40 || continue
            STREAMPOOL_WGPU_COOP_MATRIX=$c STREAMPOOL_WGPU_PROFILE=1 timeout 120 "$WORK/examples/minilm_phases" "$M" \
                --device wgpu --dtype f16 --batches 64,512 --seqs 32,128 --loop-forward 20 >"$OUT/wgpu-profile-$v.txt" 2>&1
            # The wall of the same forwards without the profile (it costs up to 0.3 ms a forward).
            for r in 1 2; do
                STREAMPOOL_WGPU_COOP_MATRIX=$c timeout 120 "$WORK/examples/minilm_phases" "$M" --device wgpu --dtype f16 \
                    --batches 64,512 --seqs 32,128 --loop-forward 20 >"$OUT/wgpu-wall-$v-$r.txt" 2>&1
            done
        done
        timeout 120 "$WORK/examples/minilm_phases" "$M" --device cuda --dtype f16 --batches 64,512 --seqs 32,128 \
            --loop-forward 50 >"$OUT/cuda-wall.txt" 2>&1
    fi
    if has mlp; then
        local mlp=(--device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 2)
        for r in $(seq 1 "$ROUNDS"); do
            room "mlp floor $r" 20 || break
            [ -n "$BEFORE" ] && bench "wgpu-mlp-before-$r" "$BEFORE" "${mlp[@]}"
            bench "wgpu-mlp-$r" "$CLI" "${mlp[@]}"
        done
    fi
    if has nn && [ -x "$WORK/tests/nn-it" ] && [ -d "$D/minilm-fp16" ] && model; then
        for c in 1 0; do
            (cd crates/streampool-nn && STREAMPOOL_MINILM_DIR=$M STREAMPOOL_WGPU_MINILM=1 STREAMPOOL_WGPU_COOP_MATRIX=$c \
                timeout 150 "$WORK/tests/nn-it" wgpu:: --nocapture --test-threads 1) >"$OUT/nn-wgpu-coop$c.log" 2>&1
            note "nn-wgpu (coop $c): exit $? $(grep -hE 'test result' "$OUT/nn-wgpu-coop$c.log")"
            grep -hE "MiniLM" "$OUT/nn-wgpu-coop$c.log" | tee -a "$SUMMARY"
        done
    fi
}

# --- python ----------------------------------------------------------------------------
# PY_THREADS (1,4,16,64), PY_ARGS (more python_embedder.py flags).
step_python() {
    model || return
    local site=$WORK/site
    rm -rf "$site"
    python3 -m pip install --no-index --no-deps --target "$site" "$D"/wheel/*.whl >"$OUT/pip.log" 2>&1 || {
        note "python: no wheel in $D/wheel"
        return
    }
    # shellcheck disable=SC2086
    PYTHONPATH=$site timeout 400 python3 bench/python_embedder.py --model "$M" --device cuda --dtype f16 \
        --threads "${PY_THREADS:-1,4,16,64}" --seconds 2 --st --out "$OUT/python_embedder.json" ${PY_ARGS:-} \
        >"$OUT/python_embedder.log" 2>&1
    note "python: exit $?"
    tail -14 "$OUT/python_embedder.log"
}

for step in "$@"; do
    fn=step_${step//-/_}
    if ! declare -F "$fn" >/dev/null; then
        echo "unknown step: $step" >&2
        exit 2
    fi
    stamp "$step" | tee -a "$SUMMARY"
    "$fn"
done
stamp done | tee -a "$SUMMARY"
cat "$OUT/machine.txt"
