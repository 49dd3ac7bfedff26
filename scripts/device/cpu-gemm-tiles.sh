#!/usr/bin/env bash
# cpu-gemm-tiles.sh: sweep the CPU matmul's tile grid (STREAMPOOL_CPU_GEMM_TILES=PER_THREAD,
# MIN_ROWS) on MiniLM's forward, batch 1 and 64, 32 and 128 tokens; then ONNX Runtime.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/streampool.xz'), open('.dev/streampool','wb'))"
chmod +x .dev/streampool
M=.dev/minilm-fp16
for T in ${TILES:-2,64 1,64 1,128 4,32 2,128 1,256}; do
  echo "== tiles $T"
  STREAMPOOL_CPU_GEMM_TILES=$T ./.dev/streampool bench --device cpu --workloads minilm32,minilm128 \
    --scenarios forward --forward-batches 1,64 --seconds "${SECS:-1}" --minilm "$M" \
    --out "$OUT/t" 2>&1 | grep -E "rows/s" | sed "s/^/[$T] /"
done > "$OUT/tiles.log" 2>&1
cat "$OUT/tiles.log"
if [ "${ONNX:-1}" = 1 ]; then
  timeout 240 python3 scripts/device/onnx_cpu.py "$M" "$OUT/onnx" "${SECS:-1}" > "$OUT/onnx.log" 2>&1
  echo "onnx rc=$?"
  grep -E "rows/s|Error" "$OUT/onnx.log" | tail -8
fi
