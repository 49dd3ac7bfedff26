#!/bin/bash
# GPU call 2 (graphs helper): GPU suites, soak with graphs, profile (wait policies), final bench
# (MLP + MiniLM-32 threading, graphs on; MLP graphs off) and the PyTorch baseline incl. graphs.
set -o pipefail
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
D=/tmp/gb; mkdir -p $D; tar xJf .dev-graphs/bins.tar.xz -C $D
nvidia-smi --query-gpu=name,driver_version --format=csv | tee $OUT/tests.log
(timeout 40 $D/cuda_graphs --test-threads=1 2>&1; echo "cuda_graphs rc=$?") >> $OUT/tests.log
(timeout 70 $D/cuda --test-threads=1 2>&1; echo "cuda rc=$?") >> $OUT/tests.log
(timeout 40 $D/streampool soak --device cuda --ops 1000000 --threads 1..64 --churn --json $OUT/soak.json 2>&1 | tail -3; echo "soak rc=$?") >> $OUT/tests.log
grep -E "test result|rc=|soak on" $OUT/tests.log
for w in hybrid spin blocking; do
  m=host; [ $w = hybrid ] && m=eager,graph,host
  (PROFILE_MODES=$m STREAMPOOL_CUDA_WAIT=$w timeout 30 $D/cuda_profile phases 2>&1) >> $OUT/profile.log
done
grep -E "^(eager|graph|host) |cuda_profile on" $OUT/profile.log | grep -E "cuda_profile|^host|^graph +(1|8|16|64) "
timeout 100 $D/streampool bench --device cuda --workloads mlp,minilm32 --scenarios threading --minilm .dev/minilm-fp16 --out /tmp/bench > $OUT/bench.log 2>&1
cp /tmp/bench/streampool.json $OUT/streampool.json
grep -E "^(mlp|minilm32) +threading|FAIL|PASS" $OUT/bench.log
STREAMPOOL_GRAPHS=0 timeout 30 $D/streampool bench --device cuda --workloads mlp --scenarios threading --seconds 1 --out /tmp/bench0 > $OUT/bench-nographs.log 2>&1
grep -E "^mlp +threading" $OUT/bench-nographs.log
(PYTHONUNBUFFERED=1 timeout 75 python3 .dev-graphs/torch_baseline.py --device cuda --workloads mlp,minilm32 --mlp-graph --mlp-batches 1 --st-batches 1 --seconds 1 --minilm .dev/minilm-fp16 --out /tmp/pt 2>&1) > $OUT/torch.log
cp /tmp/pt/pytorch.json $OUT/ 2>/dev/null
grep -E "threading" $OUT/torch.log
