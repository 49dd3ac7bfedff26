#!/usr/bin/env bash
# Issue 20, session 9, on the H100: this branch against main's binary (8b6eb79) and PyTorch.
#
# Build here (this branch):
#   cargo build --release -p streampool-cli --features cuda                  (-> $D/after.xz)
#   cargo build --release -p streampool-nn --features cuda --example forward_timeline
#                                                                            (-> $D/timeline.xz)
#   cargo test --release -p streampool --features cuda --test cuda --test cuda_graphs \
#       --test cuda_kernel_cache --no-run; cargo test --release -p streampool-nn --features cuda \
#       --test cuda --no-run                                     (-> $D/tests/*.xz, nn's as nn-cuda)
# and main's CLI at 8b6eb79 (cuda,wgpu) as $D/before.xz; every binary stripped and xz'd;
# MiniLM's fp16 folder in $D/minilm with model.safetensors xz'd
# (`xz --lzma2=preset=6,lc=1,lp=1,pb=1`: 39 MB); bench/torch_baseline.py, bench/compare.py,
# scripts/device/ncu_summary.py and this script copied into $D. Then, as the command of a
# device run with carry [".dev-s9-cuda"]:
#   DEADLINE=SECONDS bash .dev-s9-cuda/s9.sh STEPS
# STEPS, comma-separated, run in this order:
#   tests  the CUDA suites; compute-sanitizer memcheck and racecheck on
#          half_ops_match_the_cpu_backend (the pool kernel's two forms, the residual GEMM)
#   ab     forward_timeline (where a call's time goes) at 512 and 64 x 128 with the residual
#          epilogue off, by default (k >= 2n: the second FFN product) and on every product
#   ours   `streampool bench` forward: this branch and main's, alternating (RUNS)
#   ncu    kernel table of this branch's 512 x 128 call, clocks not locked
#   torch  PyTorch reduce-overhead, default, eager (in that order) until the deadline
# Narrower calls: TESTS (a glob of test binaries), SANITIZE (tools, or empty) and
# SANITIZE_ARGS (e.g. `--kernel-name kns=sp_pool_rows`: racecheck of every kernel of that test
# outran 150 s), OURS_W, RUNS,
# COMPILE_MODES, TORCH_SEQS, TORCH_MIX (empty: no mixed workload). A step that would start
# past DEADLINE seconds (default 540) is skipped and says so. Everything goes to /tmp/o,
# tarred into $OUT/s9.tgz; the side-by-side table is printed last.
set -u
STEPS=${1:-tests}
D=${D:-.dev-s9-cuda}
DEADLINE=${DEADLINE:-540}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-1.0}
O=/tmp/o
rm -rf $O; mkdir -p $O
t0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - t0))); }
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
room() { if [ "$(left)" -lt "$2" ]; then stamp "skip $1: $(left) s left" | tee -a $O/skipped.txt; return 1; fi; }
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2" && chmod +x "$2"; }

SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
M=/tmp/minilm
if [ ! -f $M/model.safetensors ]; then
    mkdir -p $M && cp -r $D/minilm/. $M/ && rm -f $M/model.safetensors.xz
    unxz $D/minilm/model.safetensors.xz $M/model.safetensors
fi
for b in after before timeline; do [ -f $D/$b.xz ] && unxz $D/$b.xz /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $O/gpu.txt 2>&1
stamp "setup"

if has tests && room tests 60; then
    mkdir -p /tmp/t
    for f in $D/tests/*.xz; do unxz "$f" "/tmp/t/$(basename "$f" .xz)"; done
    export STREAMPOOL_MINILM_DIR=$M
    # The test binaries read their data files under the folder they were built in.
    mkdir -p /work && ln -sfn "$PWD" /work/wt-s9-cuda
    for t in /tmp/t/${TESTS:-*}; do
        timeout 200 "$t" --test-threads 1 --nocapture > $O/test-$(basename "$t").log 2>&1
        echo "$(basename "$t"): exit $? $(grep -E '^test result' $O/test-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
    done
    grep -hE "mean_pool|residual" $O/test-cuda.log | head -20
    grep -hE "cosine" $O/test-nn-cuda.log | head -10
    new=half_ops_match_the_cpu_backend
    for tool in ${SANITIZE-memcheck racecheck}; do
        room "sanitize $tool" 40 || continue
        timeout $(( $(left) < 170 ? $(left) - 20 : 150 )) compute-sanitizer --tool $tool ${SANITIZE_ARGS:-} \
            /tmp/t/cuda --test-threads 1 $new > $O/$tool.log 2>&1
        echo "$tool $new: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $O/$tool.log | tr '\n' ' ')" | tee -a $O/tests.txt
    done
    stamp "tests done"
fi

if has ab; then
    for mode in off default all; do
        room "ab $mode" 30 || continue
        for b in 512 64; do
            if [ $mode = default ]; then e=X=1; else e=STREAMPOOL_CUBLASLT_RESIDUAL=$mode; fi
            env $e /tmp/timeline $M --device cuda --dtype f16 --batch $b --seq 128 --iters 60 2>&1 \
                | sed "s/^/residual=$mode /" | tee -a $O/ab.txt
        done
    done
    stamp "ab done"
fi

bench() {  # bench BINARY OUT
    local bin=$1 out=$2
    STREAMPOOL_CUBLASLT_TUNE_LOG=1 timeout 100 /tmp/$bin bench --device cuda --minilm $M --dtype f16 \
        --workloads $W --scenarios forward --forward-batches $B --seconds $SECONDS_PER_POINT --out $O/$out \
        > $O/$out.log 2>&1
    echo "$out exit $?"
    grep -E "^  minilm" $O/$out.log | sed "s/^/  $out /"
}

if has ours; then
    W=${OURS_W:-minilm32,minilm128,minilm256,minilm512,minilm-mix} B=64,512
    for run in ${RUNS:-ours1:after base1:before ours2:after base2:before ours3:after base3:before}; do
        IFS=: read name bin <<< "$run"
        room "$name" 45 || continue
        stamp "$name"
        bench $bin $name
    done
fi

if has ncu && room ncu 60; then
    stamp "ncu 512x128"
    timeout 150 ncu --clock-control none --csv --metrics gpu__time_duration.sum /tmp/timeline $M \
        --device cuda --dtype f16 --batch 512 --seq 128 --loop-forward 6 > $O/ncu-512x128.csv 2>&1
    python3 $D/ncu_summary.py $O/ncu-512x128.csv 3 --tail > $O/ncu-512x128.txt 2>&1
    head -16 $O/ncu-512x128.txt
fi

if has torch && room torch 60; then
    stamp "torch ($(left) s left)"
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
    timeout $(($(left) - 15)) python3 $D/torch_baseline.py --device cuda --minilm $M --compiled-only \
        --compile-modes ${COMPILE_MODES:-reduce-overhead,default,eager} --mask-variants mask ${TORCH_MIX---mix} \
        --compile-seqs ${TORCH_SEQS:-32,128,256,512} \
        --forward-batches 64,512 --seconds $SECONDS_PER_POINT --out $O/torch > $O/torch.log 2>&1
    echo "torch exit $?"
fi

stamp "done"
tar czf $OUT/s9.tgz -C /tmp o
cp $O/tests.txt $O/ab.txt $O/ncu-512x128.txt $OUT/ 2>/dev/null
cat $O/tests.txt $O/skipped.txt 2>/dev/null
for f in $O/ours*.log $O/base*.log; do [ -f "$f" ] && grep -E "^  minilm" "$f" | sed "s|^|$(basename $f .log) |"; done > $O/runs.txt
cp $O/runs.txt $OUT/
if [ -f $O/torch/pytorch-compiled.jsonl ]; then
    for r in ours1 ours2 ours3; do
        [ -f $O/$r/streampool.json ] || continue
        python3 $D/compare.py --compiled $O/$r/streampool.json $O/torch/pytorch-compiled.jsonl > $O/table-$r.md 2>&1
        cp $O/table-$r.md $OUT/
    done
    grep -E "^\| minilm" $O/table-ours1.md
fi
cat $O/ab.txt $O/runs.txt 2>/dev/null | grep -vE "^residual=\S+ device"
