#!/bin/bash
# GPU call 4 (graphs helper): per-op host cost (bench overhead scenario), final binaries.
set -o pipefail
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
D=/tmp/gb; mkdir -p $D; tar xJf .dev-graphs/bins.tar.xz -C $D
timeout 90 $D/streampool bench --device cuda --workloads mlp --scenarios overhead --out /tmp/ov > $OUT/overhead.log 2>&1
cp /tmp/ov/streampool.json $OUT/overhead.json
grep -iE "affine|matmul|overhead" $OUT/overhead.log | tail -8
