#!/usr/bin/env bash
# s7-wgpu device call 2: the wgpu suites on the H100 through Vulkan, `check`, the final
# matmul table next to cuBLAS, MiniLM forward on wgpu (f16, f32; attention per token for
# comparison) and CUDA f16, and the MLP batch-1 call floor on both.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
D=.dev-wgpu
for f in streampool wgpu_bench sp-wgpu-tests nn-wgpu-tests; do xz -dkf $D/$f.xz; chmod +x $D/$f; done
# Test binaries find their data under the build checkout's path.
mkdir -p /work; [ -e /work/wt-s7-wgpu ] || ln -s "$PWD" /work/wt-s7-wgpu
O=/tmp/o; mkdir -p $O
mkdir -p /tmp/m && tar -C /tmp/m -xJf $D/minilm.tar.xz
M=/tmp/m/minilm-fp16
export STREAMPOOL_MINILM_DIR=$M
T=timeout
$T 60 $D/streampool check --device wgpu > $O/check.log 2>&1; echo "check exit $?"
$T 120 $D/sp-wgpu-tests > $O/wgpu-tests.log 2>&1; echo "wgpu suite exit $?"; grep "test result" $O/wgpu-tests.log
$T 200 $D/nn-wgpu-tests --nocapture > $O/nn-wgpu.log 2>&1; echo "nn wgpu exit $?"; grep -E "test result|cosine" $O/nn-wgpu.log
$T 200 $D/wgpu_bench matmul --cuda --coop --secs 0.2 --blocks "" > $O/matmul.md 2> $O/matmul.err; echo "matmul exit $?"; tail -3 $O/matmul.err
STREAMPOOL_WGPU_LOOP_BOUNDS=1 $T 100 $D/wgpu_bench matmul --secs 0.1 --blocks "" --dtypes f32 > $O/matmul-loopbounds.md 2>&1; echo "matmul loop-bounds exit $?"
B="bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M"
for dt in f16 f32; do
  $T 150 $D/streampool $B --device wgpu --dtype $dt --out $O/fwd-wgpu-$dt > $O/fwd-wgpu-$dt.log 2>&1; echo "fwd wgpu $dt exit $?"
done
STREAMPOOL_WGPU_ATTENTION=token $T 150 $D/streampool $B --device wgpu --dtype f16 --out $O/fwd-wgpu-f16-token > $O/fwd-wgpu-f16-token.log 2>&1; echo "fwd wgpu token-attn exit $?"
if grep -q "COOPERATIVE_MATRIX reported" $O/check.log; then
  STREAMPOOL_WGPU_COOP_MATRIX=1 $T 150 $D/streampool check --device wgpu > $O/check-coop.log 2>&1; echo "check coop exit $?"
  STREAMPOOL_WGPU_COOP_MATRIX=1 $T 150 $D/sp-wgpu-tests matmul fused dtypes > $O/wgpu-tests-coop.log 2>&1; echo "suite coop exit $?"; grep "test result" $O/wgpu-tests-coop.log
  STREAMPOOL_WGPU_COOP_MATRIX=1 $T 150 $D/streampool $B --device wgpu --dtype f16 --out $O/fwd-wgpu-f16-coop > $O/fwd-wgpu-f16-coop.log 2>&1; echo "fwd wgpu coop exit $?"
fi
$T 120 $D/streampool $B --device cuda --dtype f16 --out $O/fwd-cuda-f16 > $O/fwd-cuda-f16.log 2>&1; echo "fwd cuda exit $?"
for dev in wgpu cuda; do
  $T 60 $D/streampool bench --device $dev --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 1 --out $O/mlp-$dev > $O/mlp-$dev.log 2>&1; echo "mlp $dev exit $?"
done
tar czf $OUT/call2.tgz -C /tmp o
cp $O/check.log $O/matmul.md $O/wgpu-tests.log $O/nn-wgpu.log $OUT/
for f in $O/fwd-*.log $O/mlp-*.log; do echo "== $f"; grep -E "forward|ceiling" $f | grep -v "^streampool" | head -6; done
grep -v "^- " $O/matmul.md | head -40
head -12 $O/check.log
