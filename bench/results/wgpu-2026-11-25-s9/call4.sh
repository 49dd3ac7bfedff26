#!/usr/bin/env bash
# Session 9, call 4 (#22): the blocked matmul's tile choice at the batch-64 shapes. The
# final build (call 3's binaries) with STREAMPOOL_WGPU_MATMUL_GROUPS (workgroups a tile must
# give before a larger one is taken; default 256) at 256, 128, 96 and 64: the profiled forward
# (kernel times per shape and tile) at batch 64, then walls (no profile) at all four points,
# interleaved twice.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
B=/tmp/bin; mkdir -p $B
xz -dc $D/phases.xz > $B/phases; chmod +x $B/phases
M=/tmp/minilm; mkdir -p $M; cp -r $D/minilm-shape/* $M/
python3 $D/gen_weights.py $D/minilm-header.bin $M || echo "weights: FAILED"
O=/tmp/call4; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
for g in 256 128 96 64; do
  STREAMPOOL_WGPU_MATMUL_GROUPS=$g STREAMPOOL_WGPU_PROFILE=1 timeout 60 $B/phases $M --device wgpu --dtype f16 --batches 64 --seqs 32,128 --loop-forward 20 > $O/profile-g$g.txt 2>&1
  echo "groups $g profile exit $?"
done
for r in 1 2; do for g in 256 128 96; do
  STREAMPOOL_WGPU_MATMUL_GROUPS=$g timeout 120 $B/phases $M --device wgpu --dtype f16 --batches 64,512 --seqs 32,128 --loop-forward 20 > $O/wall-g$g-$r.txt 2>&1
  echo "wall groups=$g $r: $(grep forwards $O/wall-g$g-$r.txt | sed 's/ forwards,/x/;s/ (wall.*//' | tr '\n' ';')"
done; done
cp $D/call4.sh $O/
tar cJf $OUT/call4.tar.xz -C /tmp call4
for g in 256 128 96 64; do echo "== groups $g"; grep -E "GPU per|matmul" $O/profile-g$g.txt; done
