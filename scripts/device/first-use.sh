#!/usr/bin/env bash
# The first-use figures (bench/results/first-use/) on a GPU machine, in one device call.
#
#   0 before: the whole kernels.cu of the parent commit as one NVRTC program for this GPU
#     (what every new machine compiled at start before the kernels were embedded)
#   1 serve from launch to /v2/health/ready (scripts/device/coldstart.py): first start on
#     the machine, warm caches, cache off, PTX forced (NVRTC per group at run time)
#   2 `streampool first-use` rows, each a fresh process with MiniLM f16, 8,192 mixed-length
#     texts in batches of 256, first pass against the steady state of the same process:
#       new-machine     embedded kernels, empty kernel and tuning caches, shape buckets,
#                       the tuning buckets of batches up to 256 x 256 tokens timed at start
#       new-machine-tune-in-pass  the same without that warm-up: tuning in the first pass
#       nvrtc-fallback  embedded kernels off: NVRTC compiles the groups at start
#       no-buckets      every batch at its own shape, tuning in the first pass (the path
#                       before, but for the embedded kernels), empty caches
#       warm-machine    a never-seen corpus on the machine of row 1 (tuning cache warm)
#       per-shape       buckets off, empty caches: six new shapes, each called 3 times
#
# Build here (the build embeds sm_80/sm_90 cubins when it finds NVRTC, docs/cuda.md):
#   STREAMPOOL_NVRTC=/path/to/nvidia/cu13/lib cargo build --release --features cuda -p streampool-cli
#   strip -o DIR/streampool target/release/streampool && xz -T2 DIR/streampool
#   python3 scripts/make_fp16_minilm.py DIR/minilm-f16 && xz DIR/minilm-f16/model.safetensors
#   git show PARENT:crates/streampool/src/cuda/kernels.cu > DIR/kernels-before.cu
# There (carry [DIR]): bash scripts/device/first-use.sh DIR
# Writes $OUT/first-use.json (every row), $OUT/first-use.log and coldstart.py's files.
set -uo pipefail
D=${1:?usage: first-use.sh DIR}
OUT=${OUT:-bench/results/latest}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
work=$(mktemp -d /tmp/first-use.XXXXXX)
B=$work/streampool
python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
    "$D/streampool.xz" "$B" && chmod +x "$B"
# The model folder, its safetensors xz-compressed to fit the call's carry limit.
M=$work/minilm-f16
cp -r "$D/minilm-f16" "$M"
if [ -f "$M/model.safetensors.xz" ]; then
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' \
        "$M/model.safetensors.xz" "$M/model.safetensors" && rm "$M/model.safetensors.xz"
fi
LOG=$OUT/first-use.log
{
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    nproc
} 2>&1 | tee "$LOG"

if [ -f "$D/kernels-before.cu" ]; then
    python3 - "$D/kernels-before.cu" <<'PY' 2>&1 | tee -a "$LOG"
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

python3 scripts/device/coldstart.py --bin "$B" --model "$M" --out "$OUT" --work "$work/cold" \
    2>&1 | tail -n 25 | tee -a "$LOG"

row() {
    local name=$1
    shift
    echo "== $name: first-use $*" | tee -a "$LOG"
    "$B" first-use --model "$M" --json "$work/$name.json" "$@" 2>&1 | tee -a "$LOG"
}
row new-machine --kernel-cache "$work/kc-a"
row new-machine-tune-in-pass --kernel-cache "$work/kc-e" --warm-up-tokens 0
row nvrtc-fallback --kernel-cache "$work/kc-b" --embedded-kernels false --passes 3
row no-buckets --kernel-cache "$work/kc-c" --buckets 0 --warm-up-tokens 0
row warm-machine --kernel-cache "$work/kc-a" --seed 2
row per-shape --kernel-cache "$work/kc-d" --buckets 0 --warm-up-tokens 0 --passes 1 --texts 256 \
    --per-shape 6 --seed 3

python3 - "$work" "$OUT/first-use.json" <<'PY'
import json, pathlib, sys
rows = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path(sys.argv[1]).glob("*.json"))}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print("row             ready s  first texts/s  steady texts/s  first/steady")
for name, r in rows.items():
    print(f"{name:15} {r['startup']['ready_s']:7.2f}  {r['first_pass_texts_per_s']:13.0f}  "
          f"{r['steady_texts_per_s']:14.0f}  {100 * r['first_over_steady']:11.1f}%")
PY
