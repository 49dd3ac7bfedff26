#!/usr/bin/env bash
# Session 8, call 1: the parallel `streampool` wgpu suite (main's code, 6442474) on the H100
# until it hangs (at most 5 runs), with a stack dump of every thread at the stall.
set -u
D=$PWD/.dev-s8-wgpu
for f in .gl/*.deb; do dpkg -x $f /; done; ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
mkdir -p /tmp/eu && tar xJf $D/eu.tar.xz -C /tmp/eu
xz -dkf $D/base-tests.xz; chmod +x $D/base-tests
mkdir -p /work; [ -e /work/wt-s8-wgpu ] || ln -s "$PWD" /work/wt-s8-wgpu
export O=$OUT/call1; mkdir -p $O
command -v gdb || echo "no gdb: eu-stack"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
for i in 1 2 3 4 5; do
  STALL=12 $D/hangdump.sh base-parallel-$i 45 $D/base-tests
  [ -e $O/base-parallel-$i-dump.txt ] && break
done
