#!/usr/bin/env bash
# Bisect of the parallel wgpu suite hang on the H100: the helper's branch (wip/s7-wgpu) vs
# merged main, and merged main without the allocator tests. 40 s each (a passing run: ~8 s).
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
D=.dev-s7w
for b in sp-wgpu-tests helper-wgpu-tests; do xz -dkf $D/$b.xz; chmod +x $D/$b; done
mkdir -p /work; [ -e /work/main ] || ln -s "$PWD" /work/main; [ -e /work/wt-bisect ] || ln -s "$PWD" /work/wt-bisect
O=$OUT/bisect; mkdir -p $O
run() { # name binary args...
  local n=$1 b=$2; shift 2
  (cd crates/streampool && timeout 40 ../../$D/$b "$@" > $O/$n.log 2>&1); local rc=$?
  echo "$n exit $rc: $(grep -c '\.\.\. ok' $O/$n.log) ok; $(grep 'test result' $O/$n.log)"; grep -E "FAILED" $O/$n.log | head -3
}
run helper-1 helper-wgpu-tests
run main-1 sp-wgpu-tests
run main-noalloc sp-wgpu-tests --skip allocator::
STREAMPOOL_CPU_THREADS=2 run main-cputhreads2 sp-wgpu-tests
run helper-2 helper-wgpu-tests
