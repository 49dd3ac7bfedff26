#!/usr/bin/env bash
# Session 9, call 1 (#22): where the wgpu forward's time goes on the H100, and the call floor.
#  1. the wgpu suite and the profile test (this branch's build) once;
#  2. wgpu_floor: plain-wgpu submit / wait / map round trips next to streampool's smallest call;
#  3. MiniLM-shaped f16 forward (random weights of MiniLM's names and shapes, generated here:
#     the real file is over the carry limit) at 64/512 x 32/128 tokens through minilm_phases
#     --loop-forward 20: wgpu with STREAMPOOL_WGPU_PROFILE=1 (per-kernel GPU timestamps), wgpu
#     without it (wall), CUDA (wall), and CUDA under ncu (gpu__time_duration per kernel,
#     clocks not locked) for the same shapes;
#  4. `streampool bench` MLP batch-1 floor, main's CLI (8b6eb79) against this branch's,
#     interleaved twice, then this branch's with STREAMPOOL_WGPU_PROFILE=host (host phases);
#  5. `streampool bench` forward f16 on wgpu (main's and this branch's CLI) and CUDA.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=$PATH:/usr/local/cuda/bin
B=/tmp/bin; mkdir -p $B
for b in cli-after cli-before phases floor profile-tests wgpu-tests; do xz -dc $D/$b.xz > $B/$b; chmod +x $B/$b; done
mkdir -p /work; [ -e /work/wt-s9-wgpu ] || ln -s "$PWD" /work/wt-s9-wgpu
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call1; mkdir -p $O
stamp() { echo "== $(date +%T) $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader | tee $O/gpu.txt

stamp tests
(cd crates/streampool && timeout 60 $B/profile-tests > $O/profile-tests.log 2>&1; echo "profile test exit $?"; \
 timeout 90 $B/wgpu-tests > $O/wgpu-tests.log 2>&1; echo "wgpu suite exit $?"; grep "test result" $O/wgpu-tests.log)

stamp floor
timeout 90 $B/floor --iters 2000 > $O/floor.md 2>&1; echo "floor exit $?"
STREAMPOOL_WGPU_PROFILE=1 timeout 90 $B/floor --iters 1000 > $O/floor-profile.md 2>&1; echo "floor profiled exit $?"

stamp phases
SH="--batches 64,512 --seqs 32,128"
STREAMPOOL_WGPU_PROFILE=1 timeout 120 $B/phases $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/wgpu-profile.txt 2>&1; echo "wgpu profile exit $?"
timeout 120 $B/phases $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/wgpu-wall.txt 2>&1; echo "wgpu wall exit $?"
timeout 120 $B/phases $M --device cuda --dtype f16 $SH --loop-forward 50 > $O/cuda-wall.txt 2>&1; echo "cuda wall exit $?"
for shape in 64x32 512x32 64x128 512x128; do
  b=${shape%x*}; s=${shape#*x}
  timeout 90 ncu --clock-control none --csv --metrics gpu__time_duration.sum $B/phases $M --device cuda \
     --dtype f16 --batches $b --seqs $s --loop-forward 3 > $O/ncu-$shape.csv 2>&1
  python3 scripts/device/ncu_summary.py $O/ncu-$shape.csv 3 --tail > $O/ncu-$shape.txt 2>&1
  echo "ncu $shape: $(head -2 $O/ncu-$shape.txt | tr '\n' ' ')"
done

stamp mlp
for r in 1 2; do
  for v in before after; do
    timeout 60 $B/cli-$v bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 2 --out $O/mlp-$v-$r > $O/mlp-$v-$r.log 2>&1
    echo "mlp $v $r: $(grep -h 'ceiling 1 threads batch' $O/mlp-$v-$r.log | sed 's/ *mlp ceiling 1 threads //' | tr '\n' ' ')"
  done
done
STREAMPOOL_WGPU_PROFILE=host timeout 60 $B/cli-after bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 2 --out $O/mlp-host > $O/mlp-host.log 2>&1
STREAMPOOL_WGPU_PROFILE=1 timeout 60 $B/cli-after bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 2 --out $O/mlp-gpu > $O/mlp-gpu.log 2>&1

stamp forward
for v in before after; do
  timeout 150 $B/cli-$v bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f16 --out $O/fwd-wgpu-$v > $O/fwd-wgpu-$v.log 2>&1
  echo "forward wgpu $v exit $?"
done
timeout 150 $B/cli-after bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device cuda --dtype f16 --out $O/fwd-cuda > $O/fwd-cuda.log 2>&1
echo "forward cuda exit $?"
stamp done
find $O -name "*.png" -delete; cp $D/call1.sh $D/gen_weights.py $O/
tar cJf $OUT/call1.tar.xz -C /tmp call1
cp $O/floor.md $O/floor-profile.md $O/wgpu-profile.txt $OUT/
echo; cat $O/floor.md | tail -12; tail -11 $O/floor-profile.md
grep -A16 "GPU per forward" $O/wgpu-profile.txt | head -70
for f in $O/fwd-*.log; do echo "$(basename $f)"; grep -E "forward" $f | grep -v "^streampool\|^workload" | head -4; done
grep -h "host phases" -A12 $O/mlp-host.log | head -14
