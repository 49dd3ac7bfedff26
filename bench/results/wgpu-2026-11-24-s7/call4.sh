#!/usr/bin/env bash
# s7-wgpu device call 4: which of the two call-floor changes hangs the parallel suite, and
# the per-op host cost (bench overhead scenario) on wgpu and CUDA.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
D=.dev-wgpu
for f in sp-wgpu-tests streampool; do xz -dkf $D/$f.xz; chmod +x $D/$f; done
mkdir -p /work; [ -e /work/wt-s7-wgpu ] || ln -s "$PWD" /work/wt-s7-wgpu
O=/tmp/o4; mkdir -p $O
env STREAMPOOL_WGPU_DIRECT_UPLOAD=0 timeout 45 $D/sp-wgpu-tests > $O/parallel-no-direct.log 2>&1; echo "parallel no-direct (keep on) exit $?: $(grep -c ' ok$' $O/parallel-no-direct.log) ok"
env STREAMPOOL_WGPU_KEEP_READBACK=0 timeout 45 $D/sp-wgpu-tests > $O/parallel-no-keep.log 2>&1; echo "parallel no-keep (direct on) exit $?: $(grep -c ' ok$' $O/parallel-no-keep.log) ok"
for dev in wgpu cuda; do
  timeout 60 $D/streampool bench --device $dev --workloads mlp --scenarios overhead --seconds 1 --out $O/ovh-$dev > $O/overhead-$dev.log 2>&1; echo "overhead $dev exit $?"; grep -v "^streampool" $O/overhead-$dev.log | head -4
done
STREAMPOOL_WGPU_DIRECT_UPLOAD=0 STREAMPOOL_WGPU_KEEP_READBACK=0 timeout 60 $D/streampool bench --device wgpu --workloads mlp --scenarios ceiling --ceiling-batches 1 --threads 1 --seconds 1 --out $O/mlp-neither > $O/mlp-wgpu-neither.log 2>&1; grep "ceiling" $O/mlp-wgpu-neither.log | head -2
tar czf $OUT/call4.tgz -C /tmp o4
