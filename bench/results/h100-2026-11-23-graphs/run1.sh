#!/bin/bash
# GPU call 1 (graphs helper): graph tests, profile variants, MLP threading bench graphs on/off.
set -o pipefail
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
D=/tmp/gb; mkdir -p $D; tar xJf .dev-graphs/bins.tar.xz -C $D
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/profile.log
(timeout 80 $D/cuda_graphs --test-threads=1 2>&1; echo "rc=$?") | tee $OUT/tests.log | tail -15
(timeout 50 $D/cuda_profile units 2>&1) | tee -a $OUT/profile.log
for v in "H2D=staged WAIT=spin" "H2D=pageable WAIT=spin" "H2D=staged WAIT=blocking" "H2D=staged WAIT=yield"; do
  set -- $v
  (env STREAMPOOL_CUDA_$1 STREAMPOOL_CUDA_$2 timeout 30 $D/cuda_profile phases 2>&1) | tee -a $OUT/profile.log
done
for g in 1 0; do
  STREAMPOOL_GRAPHS=$g timeout 45 $D/streampool bench --device cuda --workloads mlp --scenarios threading --seconds 1 --out /tmp/bench-g$g > $OUT/bench-graphs$g.log 2>&1
  cp /tmp/bench-g$g/streampool.json $OUT/bench-graphs$g.json
  grep -E "^\s*mlp|threads|calls" $OUT/bench-graphs$g.log | tail -12
done
(PYTHONUNBUFFERED=1 timeout 40 python3 .dev-graphs/torch_baseline.py --device cuda --workloads mlp --threads 1,8 --mlp-batches 1 --seconds 0.5 --mlp-graph --out /tmp/pt 2>&1) | tee $OUT/torch.log | grep -E "threading"
grep -E "^(eager|graph)|cuda_profile" $OUT/profile.log
