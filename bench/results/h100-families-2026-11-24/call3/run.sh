#!/usr/bin/env bash
# Device call (#23): the family ops against the CPU backend, and the tiny checkpoints of the
# new families on CUDA in f32/tf32/f16/bf16 against the float64 transformers reference.
set -u
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
D=.dev-h23
python3 -c "import lzma,shutil
for n in ['core_cuda','nn_cuda']:
    shutil.copyfileobj(lzma.open('$D/'+n+'.xz'), open('/tmp/'+n,'wb'))" && chmod +x /tmp/core_cuda /tmp/nn_cuda
# The test binaries find models and references under the path they were built in.
mkdir -p /work/wt-23 && tar xzf $D/files.tgz -C /work/wt-23
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt 2>&1
export STREAMPOOL_KERNEL_CACHE=off
timeout 240 /tmp/core_cuda --test-threads 1 --nocapture model_family_ops > $OUT/core_cuda.log 2>&1; echo "core_cuda exit $?" | tee -a $OUT/summary.txt
timeout 240 /tmp/nn_cuda --test-threads 1 --nocapture > $OUT/nn_cuda.log 2>&1; echo "nn_cuda exit $?" | tee -a $OUT/summary.txt
cat $OUT/gpu.txt
grep -E "^test |test result" $OUT/core_cuda.log
grep -E "^test |test result|cuda tiny-(xlmr|mpnet|gte|nomic|modernbert|qwen3)|classifier" $OUT/nn_cuda.log | tail -60
