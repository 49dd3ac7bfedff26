#!/usr/bin/env bash
# Session 9, call 7 (#22): the `streampool` wgpu suite with the wait-limit test ending its
# chain in one 4096^3 matmul (call 6: the test failed once, 71/72): the whole suite three
# times in parallel, then that test alone three times.
set -u
D=$PWD/.dev-s9-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
B=/tmp/bin; mkdir -p $B; xz -dc $D/wgpu-tests.xz > $B/wgpu-tests; chmod +x $B/wgpu-tests
mkdir -p /work; [ -e /work/wt-s9-wgpu ] || ln -s "$PWD" /work/wt-s9-wgpu
O=/tmp/call7; mkdir -p $O
cd crates/streampool
for i in 1 2 3; do timeout 120 $B/wgpu-tests > $O/suite-$i.log 2>&1; echo "suite $i exit $?: $(grep 'test result' $O/suite-$i.log)"; done
for i in 1 2 3; do timeout 60 $B/wgpu-tests a_wait_past_the_limit > $O/wait-$i.log 2>&1; echo "wait test $i exit $?: $(grep 'test result' $O/wait-$i.log)"; done
cp $D/call7.sh $O/; tar cJf $OUT/call7.tar.xz -C /tmp call7
