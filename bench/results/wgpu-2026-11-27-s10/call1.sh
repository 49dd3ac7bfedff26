#!/usr/bin/env bash
# Session 10, call 1 (#22): the cooperative-matrix f16 matmul (crates/streampool/src/wgpu/coop.rs)
# on the H100 through NVIDIA's Vulkan driver, against the FMA kernels and CUDA, in one call:
#   1. `streampool check --device wgpu`, default (coop off: not yet a verified adapter) and with
#      STREAMPOOL_WGPU_COOP_MATRIX=1 (the path each shape takes);
#   2. the `streampool` wgpu suite with STREAMPOOL_WGPU_COOP_MATRIX=1 (every f16 product of the
#      op and dtype suites on the coop kernels; the coop tests run every tile on matrix units
#      and emulated against float64, and four threads at once), then three copies in parallel;
#   3. the matmul microbench, f16: 16x16, blocked tiles, FMA auto, four forced coop tiles and
#      coop auto, cuBLAS, at 512^3..2048^3 and MiniLM's GEMMs at 2048 and 8192 rows (every
#      result checked against the CPU first);
#   4. MiniLM-shaped f16 forward (random weights, gen_weights.py) through `streampool bench`,
#      FMA (STREAMPOOL_WGPU_COOP_MATRIX=0) and coop (=1) interleaved twice, CUDA f16 once; the
#      GPU profile per kernel (minilm_phases, STREAMPOOL_WGPU_PROFILE=1) FMA and coop;
#   5. the MLP batch-1 call floor (coop changes nothing there: one-row products take GEMV).
# Carry [".dev-s10-wgpu", ".gl"]; run: bash .dev-s10-wgpu/call1.sh (3-4 minutes warm), or
# QUICK=1 bash .dev-s10-wgpu/call1.sh (about 1.5 minutes): steps 1-3 only, two coop tiles, so
# the correctness on matrix units and the matmul table come back from a short budget.
set -u
D=$PWD/.dev-s10-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
B=/tmp/bin; mkdir -p $B
QUICK=${QUICK:-0}
for b in cli phases bench wgpu-tests; do unxz_to $D/$b.xz $B/$b; done
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call1; mkdir -p $O
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt

# 1. The path per shape.
timeout 60 $B/cli check --device wgpu > $O/check-default.log 2>&1; echo "check default exit $?"
STREAMPOOL_WGPU_COOP_MATRIX=1 timeout 60 $B/cli check --device wgpu > $O/check-coop.log 2>&1; echo "check coop exit $?"
grep -E "matmul F16|cooperative" $O/check-coop.log | head -12
stamp check

# 2. The suite with the coop kernels on; then three at once.
export STREAMPOOL_WGPU_COOP_MATRIX=1
(cd crates/streampool && timeout 150 $B/wgpu-tests --nocapture > $O/wgpu-tests.log 2>&1; echo "wgpu suite (coop) exit $?"; grep "test result" $O/wgpu-tests.log)
grep -E "cooperative matrices with the opt-in" $O/wgpu-tests.log | head -1
if [ $QUICK = 0 ]; then
  for i in 1 2 3; do (cd crates/streampool && timeout 150 $B/wgpu-tests > $O/wgpu-tests-par$i.log 2>&1; echo "parallel $i exit $?") & done; wait
  grep -h "test result" $O/wgpu-tests-par*.log
fi
unset STREAMPOOL_WGPU_COOP_MATRIX
stamp suite

# 3. Matmul TFLOP/s.
CB=64x64x32,128x64x32,64x128x32,128x128x32; [ $QUICK = 1 ] && CB=128x64x32,128x128x32
timeout 240 $B/bench matmul --dtypes f16 --coop --coop-blocks $CB --cuda --secs 0.25 > $O/matmul.md 2> $O/matmul.err; echo "matmul bench exit $?"
stamp matmul
if [ $QUICK = 1 ]; then
  cp $D/call1.sh $O/; tar cJf $OUT/call1.tar.xz -C /tmp call1; cp $O/matmul.md $OUT/
  tail -20 $O/matmul.md; exit 0
fi

# 4. MiniLM-shaped f16 forward.
SH="--batches 64,512 --seqs 32,128"
for v in fma coop; do
  c=0; [ $v = coop ] && c=1
  STREAMPOOL_WGPU_COOP_MATRIX=$c STREAMPOOL_WGPU_PROFILE=1 timeout 120 $B/phases $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/profile-$v.txt 2>&1; echo "profile $v exit $?"
done
for r in 1 2; do for v in fma coop; do
  c=0; [ $v = coop ] && c=1
  STREAMPOOL_WGPU_COOP_MATRIX=$c timeout 150 $B/cli bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f16 --out $O/fwd-wgpu-$v-$r > $O/fwd-wgpu-$v-$r.log 2>&1
  echo "forward wgpu $v $r exit $?"
done; done
timeout 150 $B/cli bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device cuda --dtype f16 --out $O/fwd-cuda > $O/fwd-cuda.log 2>&1
echo "forward cuda exit $?"
stamp forward

# 5. MLP batch 1, one thread (the call floor).
for r in 1 2; do
  timeout 60 $B/cli bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 2 --out $O/mlp-$r > $O/mlp-$r.log 2>&1
  echo "mlp $r: $(grep -h 'ceiling 1 threads batch' $O/mlp-$r.log | sed 's/ *mlp ceiling 1 threads //' | tr '\n' ' ')"
done
stamp mlp

find $O -name "*.png" -delete; cp $D/call1.sh $O/
tar cJf $OUT/call1.tar.xz -C /tmp call1
cp $O/matmul.md $OUT/
grep -E "GPU per forward|matmul" $O/profile-fma.txt $O/profile-coop.txt | head -16
for f in $O/fwd-*.log; do echo "$(basename $f)"; grep -E "forward" $f | grep -v "^streampool\|^workload" | head -4; done
tail -30 $O/matmul.md
