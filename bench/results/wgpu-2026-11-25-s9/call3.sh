#!/usr/bin/env bash
# Session 9, call 3 (#22): the final build (`after`: profile, bias + activation in the matmul
# epilogue, GEMV with lanes per column chosen at launch, submission ramp) against main's CLI
# (`before`, 8b6eb79), in one call.
#  1. the `streampool` wgpu suite (72 tests) and the profile test on the H100;
#     `check --device wgpu` (the matmul path per shape);
#  2. wgpu_floor with host phases;
#  3. MiniLM-shaped f16 forward (random weights of MiniLM's names and shapes) through
#     minilm_phases --loop-forward 20: profiled once, then wall with the submission ramp and
#     without (STREAMPOOL_WGPU_SUBMIT_RAMP=0), interleaved twice;
#  4. `streampool bench` MLP batch 1 and 64, before/after interleaved three times; after with
#     the GPU profile and with host phases;
#  5. `streampool bench` forward on wgpu f16 (before, after, before, after), CUDA f16, wgpu
#     f32 before and after.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
B=/tmp/bin; mkdir -p $B
for b in cli-after cli-before phases floor profile-tests wgpu-tests; do xz -dc $D/$b.xz > $B/$b; chmod +x $B/$b; done
mkdir -p /work; [ -e /work/wt-s9-wgpu ] || ln -s "$PWD" /work/wt-s9-wgpu
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call3; mkdir -p $O
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt

stamp tests
(cd crates/streampool && timeout 60 $B/profile-tests > $O/profile-tests.log 2>&1; echo "profile test exit $?"; \
 timeout 120 $B/wgpu-tests > $O/wgpu-tests.log 2>&1; echo "wgpu suite exit $?"; grep "test result" $O/wgpu-tests.log)
timeout 60 $B/cli-after check --device wgpu > $O/check.log 2>&1; echo "check exit $?"; grep -iE "gemv|blocked|16x16|coop" $O/check.log | head -12

stamp floor
STREAMPOOL_WGPU_PROFILE=host timeout 90 $B/floor --iters 2000 > $O/floor.md 2>&1; echo "floor exit $?"

stamp phases
SH="--batches 64,512 --seqs 32,128"
STREAMPOOL_WGPU_PROFILE=1 timeout 120 $B/phases $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/profile.txt 2>&1; echo "profile exit $?"
for r in 1 2; do for v in 1 0; do
  STREAMPOOL_WGPU_SUBMIT_RAMP=$v timeout 120 $B/phases $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/wall-ramp$v-$r.txt 2>&1; echo "wall ramp=$v $r: $(grep forwards $O/wall-ramp$v-$r.txt | sed 's/ forwards,/x/;s/ (wall.*//' | tr '\n' ';')"
done; done

stamp mlp
for r in 1 2 3; do
  for v in before after; do
    timeout 60 $B/cli-$v bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 2 --out $O/mlp-$v-$r > $O/mlp-$v-$r.log 2>&1
    echo "mlp $v $r: $(grep -h 'ceiling 1 threads batch' $O/mlp-$v-$r.log | sed 's/ *mlp ceiling 1 threads //' | tr '\n' ' ')"
  done
done
STREAMPOOL_WGPU_PROFILE=host timeout 60 $B/cli-after bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 2 --out $O/mlp-host > $O/mlp-host.log 2>&1
STREAMPOOL_WGPU_PROFILE=1 timeout 60 $B/cli-after bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 2 --out $O/mlp-gpu > $O/mlp-gpu.log 2>&1

stamp forward
for r in 1 2; do for v in before after; do
  timeout 150 $B/cli-$v bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f16 --out $O/fwd-wgpu-$v-$r > $O/fwd-wgpu-$v-$r.log 2>&1
  echo "forward wgpu $v $r exit $?"
done; done
timeout 150 $B/cli-after bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device cuda --dtype f16 --out $O/fwd-cuda > $O/fwd-cuda.log 2>&1
echo "forward cuda exit $?"
for v in before after; do
  timeout 150 $B/cli-$v bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f32 --out $O/fwd-wgpu-f32-$v > $O/fwd-wgpu-f32-$v.log 2>&1
  echo "forward wgpu f32 $v exit $?"
done
stamp done
find $O -name "*.png" -delete; cp $D/call3.sh $D/gen_weights.py $O/
tar cJf $OUT/call3.tar.xz -C /tmp call3
cp $O/floor.md $O/profile.txt $OUT/
echo; tail -13 $O/floor.md
grep -E "GPU per forward|forwards" $O/profile.txt
for f in $O/fwd-*.log; do echo "$(basename $f)"; grep -E "forward" $f | grep -v "^streampool\|^workload" | head -4; done
grep -h "wgpu GPU" -A3 $O/mlp-gpu.log | head -4
