#!/usr/bin/env bash
# Session 9, call 6 (#22): attention whose tile max and PV loop run over the whole tile in two chains (`after`), against call 5's final build (`mid`) and main's CLI (`before`).
#  1. the `streampool` wgpu suite (after) on the H100;
#  2. minilm_phases profiled, mid then after, and walls interleaved twice;
#  3. `streampool bench` forward f16 before/after interleaved twice, CUDA f16.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
B=/tmp/bin; mkdir -p $B
for b in cli-after cli-before phases phases-mid wgpu-tests; do xz -dc $D/$b.xz > $B/$b; chmod +x $B/$b; done
mkdir -p /work; [ -e /work/wt-s9-wgpu ] || ln -s "$PWD" /work/wt-s9-wgpu
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call6; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
(cd crates/streampool && timeout 120 $B/wgpu-tests > $O/wgpu-tests.log 2>&1; echo "wgpu suite exit $?"; grep "test result" $O/wgpu-tests.log)
SH="--batches 64,512 --seqs 32,128"
for v in mid after; do
  p=$B/phases; [ $v = mid ] && p=$B/phases-mid
  STREAMPOOL_WGPU_PROFILE=1 timeout 120 $p $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/profile-$v.txt 2>&1; echo "profile $v exit $?"
done
for r in 1 2; do for v in mid after; do
  p=$B/phases; [ $v = mid ] && p=$B/phases-mid
  timeout 120 $p $M --device wgpu --dtype f16 $SH --loop-forward 20 > $O/wall-$v-$r.txt 2>&1; echo "wall $v $r: $(grep forwards $O/wall-$v-$r.txt | sed 's/ forwards,/x/;s/ (wall.*//' | tr '\n' ';')"
done; done
for r in 1 2; do for v in before after; do
  timeout 150 $B/cli-$v bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f16 --out $O/fwd-wgpu-$v-$r > $O/fwd-wgpu-$v-$r.log 2>&1
  echo "forward wgpu $v $r exit $?"
done; done
timeout 150 $B/cli-after bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device cuda --dtype f16 --out $O/fwd-cuda > $O/fwd-cuda.log 2>&1
echo "forward cuda exit $?"
find $O -name "*.png" -delete; cp $D/call6.sh $O/
tar cJf $OUT/call6.tar.xz -C /tmp call6
grep -E "GPU per forward|attention" $O/profile-mid.txt $O/profile-after.txt
for f in $O/fwd-*.log; do echo "$(basename $f)"; grep -E "forward" $f | grep -v "^streampool\|^workload" | head -4; done
