#!/usr/bin/env bash
# Session 7, after the merge: the `streampool` wgpu suite on the H100 through Vulkan, in
# parallel (the default) three times, with the allocator test's wider GPU window.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
D=.dev-s7w
xz -dkf $D/sp-wgpu-tests.xz; chmod +x $D/sp-wgpu-tests
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main
O=$OUT/wgpu-parallel; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/gpu.txt
for i in 1 2 3; do
  (cd crates/streampool && timeout 150 ../../$D/sp-wgpu-tests > $O/parallel-$i.log 2>&1); rc=$?
  echo "parallel run $i exit $rc: $(grep 'test result' $O/parallel-$i.log)"; grep -E "FAILED|panicked" $O/parallel-$i.log | head -5
done
