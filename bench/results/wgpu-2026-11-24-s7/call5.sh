#!/usr/bin/env bash
# s7-wgpu device call 5: the `streampool` wgpu suite on the committed code (direct uploads
# removed), in parallel (the default) and one test at a time; the at-limit allocator test
# alone three times.
set -u
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
D=.dev-wgpu
xz -dkf $D/sp-wgpu-tests.xz; chmod +x $D/sp-wgpu-tests
mkdir -p /work; [ -e /work/wt-s7-wgpu ] || ln -s "$PWD" /work/wt-s7-wgpu
O=/tmp/o5; mkdir -p $O
timeout 90 $D/sp-wgpu-tests > $O/final-parallel.log 2>&1; echo "parallel exit $?: $(grep 'test result' $O/final-parallel.log)"; grep FAILED $O/final-parallel.log
timeout 90 $D/sp-wgpu-tests --test-threads=1 > $O/final-serial.log 2>&1; echo "serial exit $?: $(grep 'test result' $O/final-serial.log)"
for i in 1 2 3; do timeout 30 $D/sp-wgpu-tests --exact allocator::at_the_limit_a_pending_block_is_reused_behind_a_device_side_wait > $O/at-limit-$i.log 2>&1; echo "at-limit alone $i: $(grep 'test result' $O/at-limit-$i.log)"; done
tar czf $OUT/call5.tgz -C /tmp o5
