#!/usr/bin/env bash
# s7-wgpu device call 3: the wgpu suite timed out at 120 s in call 2 (3 of 71 done); find
# the test and whether the direct uploads or kept read-back buffers cause it.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
D=.dev-wgpu
xz -dkf $D/sp-wgpu-tests.xz; chmod +x $D/sp-wgpu-tests
mkdir -p /work; [ -e /work/wt-s7-wgpu ] || ln -s "$PWD" /work/wt-s7-wgpu
O=/tmp/o3; mkdir -p $O
run() { # name, env...
  local name=$1; shift
  env "$@" timeout 60 $D/sp-wgpu-tests --test-threads=1 > $O/$name.log 2>&1; echo "$name exit $?: $(grep -c ' ok$' $O/$name.log) ok; last: $(grep '^test ' $O/$name.log | tail -1)"
}
run serial-default A=1
run serial-no-direct STREAMPOOL_WGPU_DIRECT_UPLOAD=0
run serial-no-keep STREAMPOOL_WGPU_KEEP_READBACK=0
run serial-neither STREAMPOOL_WGPU_DIRECT_UPLOAD=0 STREAMPOOL_WGPU_KEEP_READBACK=0
env timeout 60 $D/sp-wgpu-tests > $O/parallel-default.log 2>&1; echo "parallel exit $?: $(grep -c ' ok$' $O/parallel-default.log) ok"
env STREAMPOOL_WGPU_DIRECT_UPLOAD=0 STREAMPOOL_WGPU_KEEP_READBACK=0 timeout 60 $D/sp-wgpu-tests > $O/parallel-neither.log 2>&1; echo "parallel-neither exit $?: $(grep -c ' ok$' $O/parallel-neither.log) ok"
tar czf $OUT/call3.tgz -C /tmp o3
