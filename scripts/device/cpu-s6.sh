#!/usr/bin/env bash
# cpu-s6.sh: issue 24 on the GPU machine's host CPU: streampool --device cpu against PyTorch
# CPU eager and sentence-transformers, same cores, same run, one after the other.
#
# Carry: .dev/streampool.xz (release CLI, built without CUDA is fine), .dev/minilm-fp16.
# Usage there: bash scripts/device/cpu-s6.sh   (writes under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/ours" "$OUT/torch"
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/streampool.xz'), open('.dev/streampool','wb'))"
chmod +x .dev/streampool
M=.dev/minilm-fp16
SECS=${SECS:-2}
{
  lscpu
  echo "nproc: $(nproc)"
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads(), 'mkldnn', torch.backends.mkldnn.is_available()); print(torch.__config__.show())" 2>&1 | head -30
  python3 -c "import onnxruntime; print('onnxruntime', onnxruntime.__version__)" 2>&1 | tail -1
} > "$OUT/host.txt" 2>&1
head -20 "$OUT/host.txt" | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|Flags" | cut -c1-200

# Ours: forward (pre-tokenized) at batch 1, 16, 64; end to end (ceiling) at 1, 16, 64;
# 16 threads with one sentence each (threading) and 16 callers through the BatchQueue.
./.dev/streampool bench --device cpu --workloads minilm32,minilm128 \
  --scenarios forward,ceiling,threading,batching --forward-batches 1,16,64 \
  --ceiling-batches 1,16,64 --threads 1,16 --max-batch 16 --max-wait-ms 0 \
  --seconds "$SECS" --minilm "$M" --out "$OUT/ours" > "$OUT/ours.log" 2>&1
echo "ours rc=$?"
tail -40 "$OUT/ours.log"

# PyTorch: HF BertModel eager forward (f32) at the same batches, sentence-transformers
# encode (f32) at the same batches and 1/16 threads; all cores (PyTorch's default).
python3 bench/torch_baseline.py --device cpu --workloads minilm32,minilm128 --dtypes f32 \
  --forward-batches 1,16,64 --st-batches 1,16,64 --threads 1,16 --seconds "$SECS" \
  --minilm "$M" --out "$OUT/torch" > "$OUT/torch.log" 2>&1
echo "torch rc=$?"
tail -30 "$OUT/torch.log"

python3 bench/compare.py --dtypes "$OUT/ours/streampool.json" "$OUT/torch/pytorch.json" > "$OUT/compare.md" 2>&1
python3 bench/cpu_compare.py "$OUT/ours/streampool.json" "$OUT/torch/pytorch.json" > "$OUT/cpu-compare.md" 2>&1
cat "$OUT/cpu-compare.md"

# ONNX Runtime (if installed there): the model exported by PyTorch in this call.
if [ "${ONNX:-1}" = 1 ]; then
  timeout 240 python3 scripts/device/onnx_cpu.py "$M" "$OUT/onnx" "$SECS" > "$OUT/onnx.log" 2>&1
  echo "onnx rc=$?"
  grep -E "rows/s|Error|error" "$OUT/onnx.log" | tail -8
fi
