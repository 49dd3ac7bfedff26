#!/usr/bin/env bash
# Session 9, call 2 (#22): the changes, before/after in one call. Builds: `before` = main's CLI
# (8b6eb79); `mid` = call 1's minilm_phases (the profile only: main's kernels); `after` = this
# branch (bias + activation fused into the matmul epilogue, GEMV for one-row matmuls, each
# attention probability computed once).
#  1. the wgpu suite and the profile test (after) on the H100;
#  2. wgpu_floor (after);
#  3. MiniLM-shaped f16 forward (random weights, MiniLM's names and shapes) through
#     minilm_phases --loop-forward 20, mid then after: profiled (STREAMPOOL_WGPU_PROFILE=1), then
#     wall without the profile;
#  4. `streampool bench` MLP batch 1 and 64, before/after interleaved three times; after with
#     the GPU profile and with host phases;
#  5. `streampool bench` forward f16 on wgpu (before, after, before, after), CUDA f16 once,
#     wgpu f32 (after) once.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
B=/tmp/bin; mkdir -p $B
for b in cli-after cli-before phases phases-mid floor profile-tests wgpu-tests; do xz -dc $D/$b.xz > $B/$b; chmod +x $B/$b; done
mkdir -p /work; [ -e /work/wt-s9-wgpu ] || ln -s "$PWD" /work/wt-s9-wgpu
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call2; mkdir -p $O
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt

stamp tests
(cd crates/streampool && timeout 60 $B/profile-tests > $O/profile-tests.log 2>&1; echo "profile test exit $?"; \
 timeout 90 $B/wgpu-tests > $O/wgpu-tests.log 2>&1; echo "wgpu suite exit $?"; grep "test result" $O/wgpu-tests.log)

stamp floor
STREAMPOOL_WGPU_PROFILE=host timeout 90 $B/floor --iters 2000 > $O/floor.md 2>&1; echo "floor exit $?"

stamp phases
SH="--batches 64,512 --seqs 32,128"
for v in mid after; do
  p=$B/phases; [ $v = mid ] && p=$B/phases-mid
  STREAMPOOL_WGPU_PROFILE=1 timeout 120 $p $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/profile-$v.txt 2>&1; echo "profile $v exit $?"
done
for r in 1 2; do for v in mid after; do
  p=$B/phases; [ $v = mid ] && p=$B/phases-mid
  timeout 120 $p $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/wall-$v-$r.txt 2>&1; echo "wall $v $r: $(grep forwards $O/wall-$v-$r.txt | sed 's/ forwards,/x/;s/ (wall.*//' | tr '\n' ';')"
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
timeout 150 $B/cli-after bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f32 --out $O/fwd-wgpu-f32 > $O/fwd-wgpu-f32.log 2>&1
echo "forward wgpu f32 exit $?"
stamp done
find $O -name "*.png" -delete; cp $D/call2.sh $D/gen_weights.py $O/
tar cJf $OUT/call2.tar.xz -C /tmp call2
cp $O/floor.md $O/profile-after.txt $O/profile-mid.txt $OUT/
echo; tail -20 $O/floor.md
grep -E "GPU per forward|attention|forwards" $O/profile-mid.txt $O/profile-after.txt
for f in $O/fwd-*.log; do echo "$(basename $f)"; grep -E "forward" $f | grep -v "^streampool\|^workload" | head -4; done
grep -h "wgpu GPU" -A5 $O/mlp-gpu.log | head -6
