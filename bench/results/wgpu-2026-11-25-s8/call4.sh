#!/usr/bin/env bash
# Session 8, call 4: the final build (this branch's last code commit). The parallel
# `streampool` wgpu suite three times; the MLP call floor and the MiniLM f16 forward with
# launch parameters in mapped buffers (default) and without (STREAMPOOL_WGPU_MAPPED_PARAMS=0),
# interleaved.
set -u
D=$PWD/.dev-s8-wgpu; M=$PWD/.dev/minilm-fp16
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
# (no eu-stack in this call: the carry is at its limit)
for b in fix-tests-final cli-fix; do xz -dkf $D/$b.xz; chmod +x $D/$b; done
mkdir -p /work; [ -e /work/wt-s8-wgpu ] || ln -s "$PWD" /work/wt-s8-wgpu
export O=/tmp/call4; mkdir -p $O
command -v perf >/dev/null && echo "perf: yes" || echo "perf: no"
for i in 1 2 3; do STALL=15 $D/hangdump.sh final-parallel-$i 60 $D/fix-tests-final; done
for r in 1 2 3; do
  for v in 1 0; do
    STREAMPOOL_WGPU_MAPPED_PARAMS=$v timeout 60 $D/cli-fix bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1,64 --threads 1 --seconds 2 --out $O/mlp-mapped$v-$r > $O/mlp-mapped$v-$r.log 2>&1
    echo "mlp mapped=$v run $r: $(grep -h 'ceiling 1 threads batch' $O/mlp-mapped$v-$r.log | sed 's/ *mlp ceiling 1 threads //' | tr '\n' ' ')"
  done
done
for v in 1 0; do
  STREAMPOOL_WGPU_MAPPED_PARAMS=$v timeout 150 $D/cli-fix bench --workloads minilm32,minilm128 --scenarios forward --forward-batches 64,512 --seconds 1 --minilm $M --device wgpu --dtype f16 --out $O/fwd-f16-mapped$v > $O/fwd-f16-mapped$v.log 2>&1
  echo "forward f16 mapped=$v (exit $?):"; grep -E "forward" $O/fwd-f16-mapped$v.log | grep -v "^streampool\|^workload" | head -4
done
find $O -name "*.png" -delete; cp $D/call4.sh $O/
tar cJf $OUT/call4-logs.tar.xz -C /tmp call4
