#!/usr/bin/env bash
# Session 8, call 2: the parallel `streampool` wgpu suite on the H100, fixed build (one
# wgpu instance and device per adapter kept for the process; bounded waits; decided timing
# windows) six times, then main's build (6442474) twice, then the fixed build one test at a
# time; a stack dump of every thread at any stall.
set -u
D=$PWD/.dev-s8-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/eu && tar xJf $D/eu.tar.xz -C /tmp/eu
for b in base-tests fix-tests; do xz -dkf $D/$b.xz; chmod +x $D/$b; done
mkdir -p /work; [ -e /work/wt-s8-wgpu ] || ln -s "$PWD" /work/wt-s8-wgpu
export O=$OUT/call2; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2 3 4 5 6; do STALL=15 $D/hangdump.sh fix-parallel-$i 60 $D/fix-tests; done
for i in 1 2; do STALL=15 $D/hangdump.sh base-parallel-$i 45 $D/base-tests; done
STALL=30 $D/hangdump.sh fix-serial 120 $D/fix-tests --test-threads=1
