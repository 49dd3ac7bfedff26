#!/usr/bin/env bash
# cpu-profile-s6.sh: where a CPU forward spends its time, ours (STREAMPOOL_CPU_PROFILE=1, per
# kernel and shape) and PyTorch's (torch.profiler, F.linear on the same GEMM shapes).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('.dev/streampool.xz'), open('.dev/streampool','wb'))"
chmod +x .dev/streampool
M=.dev/minilm-fp16
# GEMM=tiles (default: our grid of single-threaded gemm tiles) and GEMM=gemm (the gemm
# crate's own rayon split), one after the other.
for GEMM in ${GEMMS:-tiles gemm}; do
  STREAMPOOL_CPU_GEMM=$GEMM STREAMPOOL_CPU_PROFILE=1 ./.dev/streampool bench --device cpu \
    --workloads minilm32,minilm128 --scenarios forward --forward-batches 1,64 \
    --seconds "${SECS:-1.5}" --minilm "$M" --out "$OUT/ours-$GEMM" > "$OUT/ours-profile-$GEMM.log" 2>&1
  echo "ours ($GEMM) rc=$?"
  grep -E "rows/s|^ +[0-9.]+%" "$OUT/ours-profile-$GEMM.log" | head -${LINES_PER:-40}
done
if [ "${TORCH:-1}" = 1 ]; then
  python3 scripts/device/cpu_profile.py "$M" > "$OUT/torch-profile.log" 2>&1
  echo "torch rc=$?"
  grep -E "^\|" "$OUT/torch-profile.log"
fi
