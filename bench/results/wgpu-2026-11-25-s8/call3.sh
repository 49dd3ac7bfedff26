#!/usr/bin/env bash
# Session 8, call 3: the final build. The parallel `streampool` wgpu suite six times and
# the CPU allocator suite three times (its timing tests changed); the `streampool-nn` wgpu
# suite (no MiniLM weights in this call: its reference test skips); then the MLP call
# floor (batch 1, 1 thread) and the per-op host cost, main's CLI (6442474) against this
# branch's, with launch parameters in mapped buffers (default) and without
# (STREAMPOOL_WGPU_MAPPED_PARAMS=0), interleaved twice.
set -u
D=$PWD/.dev-s8-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/eu && tar xJf $D/eu.tar.xz -C /tmp/eu
for b in fix-tests alloc-cpu-tests nn-tests cli-main cli-fix; do xz -dkf $D/$b.xz; chmod +x $D/$b; done
mkdir -p /work; [ -e /work/wt-s8-wgpu ] || ln -s "$PWD" /work/wt-s8-wgpu
export O=/tmp/call3; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
for i in 1 2 3 4 5 6; do STALL=15 $D/hangdump.sh fix-parallel-$i 60 $D/fix-tests; done
for i in 1 2 3; do STALL=15 $D/hangdump.sh alloc-cpu-$i 60 $D/alloc-cpu-tests; done
DIR=crates/streampool-nn STALL=30 $D/hangdump.sh nn-wgpu 150 $D/nn-tests
for r in 1 2; do
  for v in main fix fix-nomap; do
    b=$D/cli-fix; [ $v = main ] && b=$D/cli-main
    env $([ $v = fix-nomap ] && echo STREAMPOOL_WGPU_MAPPED_PARAMS=0) timeout 60 $b bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 2 --out $O/mlp-$v-$r > $O/mlp-$v-$r.log 2>&1
    env $([ $v = fix-nomap ] && echo STREAMPOOL_WGPU_MAPPED_PARAMS=0) timeout 60 $b bench --device wgpu --workloads mlp --scenarios overhead --seconds 1 --out $O/ovh-$v-$r > $O/overhead-$v-$r.log 2>&1
    echo "$v run $r: $(grep -h 'ceiling 1 threads batch' $O/mlp-$v-$r.log | sed 's/ *mlp ceiling 1 threads //' | tr '\n' ' ') | $(grep -h 'overhead enqueue' $O/overhead-$v-$r.log | sed 's/.*queued): //')"
  done
done
cp $D/call3.sh $D/hangdump.sh $O/
tar cJf $OUT/call3-logs.tar.xz -C /tmp call3
