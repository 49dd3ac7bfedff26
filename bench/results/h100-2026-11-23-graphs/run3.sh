#!/bin/bash
# GPU call 3 (graphs helper): final bench (MLP + MiniLM-32 threading, graphs on, spin waits),
# phase profile, and the PyTorch baseline with its CUDA-graph MLP path, in one call.
set -o pipefail
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:$LD_LIBRARY_PATH
D=/tmp/gb; mkdir -p $D; tar xJf .dev-graphs/bins.tar.xz -C $D
timeout 100 $D/streampool bench --device cuda --workloads mlp,minilm32 --scenarios threading --minilm .dev/minilm-fp16 --out /tmp/bench > $OUT/streampool.log 2>&1
cp /tmp/bench/streampool.json $OUT/streampool.json
(PROFILE_MODES=eager,graph,host timeout 40 $D/cuda_profile phases 2>&1) > $OUT/profile.log
(PYTHONUNBUFFERED=1 timeout 100 python3 .dev-graphs/torch_baseline.py --device cuda --workloads mlp,minilm32 --mlp-graph --mlp-batches 1 --st-batches 1 --seconds 1 --minilm .dev/minilm-fp16 --out /tmp/bench 2>&1) > $OUT/pytorch.log
cp /tmp/bench/pytorch.json $OUT/ 2>/dev/null
python3 bench/compare.py /tmp/bench > $OUT/compare.md 2>&1
grep -E "^(mlp|minilm32) +threading|FAIL|PASS" $OUT/streampool.log
grep -E "^(eager|host) " $OUT/profile.log
grep -E "threading" $OUT/pytorch.log
