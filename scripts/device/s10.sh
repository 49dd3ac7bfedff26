#!/usr/bin/env bash
# s10.sh: session 10's lead call on the H100 machine (one call; carry [".dev"]):
#   .dev/streampool.xz  `cargo build --release -p streampool-cli --features cuda`, stripped, xz
#   .dev/minilm-fp16    scripts/make_fp16_minilm.py's folder
# 1. #24 on the 16-core host: the f32 forward at batch 1, 16 and 64 (32 and 128 tokens) and
#    16 callers with one sentence each through the BatchQueue (max batch 16, continuous
#    batching) against the batch-16 forward, with the process's OS threads (the bench's
#    batching lines report them); PyTorch eager f32 at the same batches, bench/cpu_compare.py.
# 2. #20's fp32 check: our f32 (TF32 off) forward at 32 and 128 tokens, batch 64 and 512, and
#    PyTorch fp32 eager in the same call (session 4's figures, before #20, in
#    docs/figures.md: ours 45,054 / 10,520 and PyTorch 44,350 / 12,904 at batch 512).
# Usage there: bash scripts/device/s10.sh   (logs under $OUT; a summary printed last)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
B=/tmp/keep; mkdir -p $B
python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" .dev/streampool.xz $B/streampool
chmod +x $B/streampool
M=$PWD/.dev/minilm-fp16
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv; } > $OUT/host.txt 2>&1

# 1. CPU (#24).
$B/streampool bench --device cpu --workloads minilm32,minilm128 --scenarios forward,batching \
  --forward-batches 1,16,64 --threads 1,16 --max-batch 16 --max-wait-ms 0 --seconds 1.5 \
  --minilm $M --dtypes f32 --out $OUT/cpu > $OUT/cpu.log 2>&1
stamp "cpu rc=$?"
timeout 300 python3 bench/torch_baseline.py --device cpu --workloads minilm32,minilm128 --dtypes f32 --dtype-only \
  --forward-batches 1,16,64 --seconds 1.5 --minilm $M --out $OUT/torch-cpu > $OUT/torch-cpu.log 2>&1
stamp "torch cpu rc=$?"
python3 bench/cpu_compare.py $OUT/cpu/streampool.json $OUT/torch-cpu/pytorch.json > $OUT/cpu-compare.md 2>&1

# 2. CUDA fp32 (#20): ours, then PyTorch eager fp32 (TF32 off) at the same points.
$B/streampool bench --device cuda --workloads minilm32,minilm128 --scenarios forward \
  --forward-batches 64,512 --seconds 1.5 --minilm $M --dtypes f32 --out $OUT/f32 > $OUT/f32.log 2>&1
stamp "cuda f32 rc=$?"
timeout 240 python3 bench/torch_baseline.py --device cuda --workloads minilm32,minilm128 --dtypes f32 \
  --dtype-only --forward-batches 64,512 --seconds 1.5 --minilm $M --out $OUT/torch-f32 > $OUT/torch-f32.log 2>&1
stamp "torch f32 rc=$?"

{
  echo "== cpu (16-core host) =="; grep -E "^\|" $OUT/cpu-compare.md | grep -E "callers|forward" | head -12
  echo "== cuda f32 =="; grep -E "^  minilm" $OUT/f32.log
  echo "== torch f32 =="; grep -iE "forward" $OUT/torch-f32.log | tail -8
} | tee $OUT/summary.txt
