#!/usr/bin/env bash
# s7-wgpu device call 1: the blocked-matmul tuning sweep (f32 and f16, every tile, cuBLAS
# next to it), each kernel's result checked against the CPU first.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
ls /usr/local/nvidia/share/vulkan/icd.d/ /usr/share/vulkan/icd.d/ 2>&1 | head -5
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
D=.dev-wgpu
xz -dkf $D/wgpu_bench.xz && chmod +x $D/wgpu_bench
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv > $OUT/gpu.txt 2>&1
timeout 420 $D/wgpu_bench matmul --cuda --secs 0.1 \
  --blocks 64x64x8,64x64x16,64x64x32,128x64x8,128x64x16,128x64x32,64x128x16,128x128x8,128x128x16,128x128x32 \
  > $OUT/sweep.md 2> $OUT/sweep.err
echo "exit $?"
tail -5 $OUT/sweep.err
cat $OUT/sweep.md | grep -v "^- "
