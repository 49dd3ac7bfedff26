#!/usr/bin/env bash
# Issue 20, session 7, on the H100 in one device call: the CUDA suites and compute-sanitizer on
# the new kernels (tests), an A/B of this session's changes in one binary (ab:
# STREAMPOOL_CUBLASLT_TUNE and STREAMPOOL_CUDA_LN added one at a time at 128-512 tokens, with
# the tuning log; call 1 also had STREAMPOOL_CUDA_ATTN, for an attention variant since
# reverted), ncu kernel tables (ncu), the default against 8 and 32 timed candidates (tuneab),
# and the side-by-side against PyTorch eager and
# torch.compile (ours, torch; `bench/compare.py --compiled` prints the table last).
#
# Build here: the streampool binary, the minilm_phases example and the test binaries
# (`cargo test --release -p streampool --features cuda --test cuda --test cuda_graphs
# --no-run`, `-p streampool-nn ... --test cuda`), stripped and xz'd into $D (default
# .dev-cuda, tests under $D/tests), with MiniLM's fp16 folder in .dev/minilm-fp16 or, to fit
# the carry limit, copied into $D/minilm with model.safetensors xz'd; then, as the command of a
# device run with carry [".dev-cuda"] (and ".dev/minilm-fp16" for the first form):
#   bash .dev-cuda/tune-s7.sh STEPS      (comma-separated: ab,ncu,tests,ours,tuneab,torch)
# Everything goes to /tmp/o, tarred into $OUT/s7.tgz.
set -u
STEPS=${1:-tests,ab,ncu}
D=${D:-.dev-cuda}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-1.0}
TORCH_TIMEOUT=${TORCH_TIMEOUT:-400}
M=.dev/minilm-fp16
O=/tmp/o
mkdir -p $O
# The fp16 weights xz'd into $D/minilm (carry limit): unpacked to /tmp/minilm.
if [ -f $D/minilm/model.safetensors.xz ]; then
    mkdir -p /tmp/minilm && cp -r $D/minilm/. /tmp/minilm/ && rm /tmp/minilm/model.safetensors.xz
    python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/minilm/model.safetensors.xz'), open('/tmp/minilm/model.safetensors','wb'))"
    M=/tmp/minilm
fi
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
has() { [[ ",$STEPS," == *",$1,"* ]]; }
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2" && chmod +x "$2"; }
for b in streampool minilm_phases; do [ -f $D/$b.xz ] && unxz $D/$b.xz /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $O/gpu.txt 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

if has ab; then
    # Each change on top of the last: session 6's paths, + timed GEMM algorithms, + the vec8
    # layer norm (this session's defaults).
    for cfg in off,warp 16,warp 16,vec8; do
        IFS=, read tune ln <<< "$cfg"
        stamp "ab tune=$tune ln=$ln"
        STREAMPOOL_CUBLASLT_TUNE=$tune STREAMPOOL_CUDA_LN=$ln STREAMPOOL_CUBLASLT_TUNE_LOG=1 \
            timeout 120 /tmp/streampool bench --device cuda --minilm $M --dtype f16 \
            --workloads ${AB_WORKLOADS:-minilm128,minilm256,minilm512} --scenarios forward \
            --forward-batches ${AB_BATCHES:-64,512} --seconds $SECONDS_PER_POINT --out $O/ab-$tune-$ln \
            > $O/ab-$tune-$ln.log 2>&1
        echo "exit $?"; grep -E "^  minilm" $O/ab-$tune-$ln.log
    done
    grep -h "cuBLASLt tuning" $O/ab-16-vec8.log | head -30
fi

if has ncu; then
    for shape in ${NCU_SHAPES:-512x128 64x512}; do
        b=${shape%x*}; s=${shape#*x}
        stamp "ncu $shape"
        timeout 150 ncu --csv --metrics gpu__time_duration.sum /tmp/minilm_phases $M --device cuda \
            --dtype f16 --batches $b --seqs $s --loop-forward 4 > $O/ncu-$shape.csv 2>&1
        # $D's copy: the device run sends another checkout's scripts/.
        python3 $D/ncu_summary.py $O/ncu-$shape.csv 3 --tail > $O/ncu-$shape.txt 2>&1
        head -14 $O/ncu-$shape.txt
    done
fi

if has tests; then
    stamp "tests"
    mkdir -p /tmp/t
    for f in $D/tests/*.xz; do unxz "$f" "/tmp/t/$(basename "$f" .xz)"; done
    export STREAMPOOL_MINILM_DIR=$(cd $M && pwd)
    # The test binaries read their data files at the path they were built in.
    [ -n "${BUILT_IN:-}" ] && mkdir -p "$(dirname "$BUILT_IN")" && ln -sfn "$PWD" "$BUILT_IN"
    for t in /tmp/t/*; do
        timeout 240 "$t" --test-threads 1 --nocapture > $O/test-$(basename "$t").log 2>&1
        echo "$(basename "$t"): exit $? $(grep -E '^test result' $O/test-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
    done
    grep -hE "layer_norm|matmul \+ bias|cosine" $O/test-*.log | head -40
    if [ -n "${SANITIZE:-}" ]; then
        t=$(ls /tmp/t/core-cuda-* | head -1)
        for tool in memcheck racecheck; do
            timeout 200 compute-sanitizer --tool $tool "$t" --test-threads 1 $SANITIZE > $O/$tool.log 2>&1
            echo "$tool $(basename "$t") $SANITIZE: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $O/$tool.log | tr '\n' ' ')" | tee -a $O/tests.txt
        done
    fi
fi

if has ours; then
    stamp "ours"
    STREAMPOOL_CUBLASLT_TUNE_LOG=1 timeout 200 /tmp/streampool bench --device cuda --minilm $M --dtype f16 \
        --workloads minilm32,minilm128,minilm256,minilm512,minilm-mix --scenarios forward \
        --forward-batches 64,512 --seconds $SECONDS_PER_POINT --out $O/ours > $O/ours.log 2>&1
    echo "ours exit $?"; grep -E "^  minilm" $O/ours.log
fi

if has tuneab; then
    # How many of the heuristic's algorithms to time: 8 and 32 against the default (16, `ours`).
    for tune in 8 32; do
        stamp "tuneab tune=$tune"
        STREAMPOOL_CUBLASLT_TUNE=$tune STREAMPOOL_CUBLASLT_TUNE_LOG=1 timeout 120 /tmp/streampool bench \
            --device cuda --minilm $M --dtype f16 --workloads minilm128,minilm256,minilm512 \
            --scenarios forward --forward-batches 512 --seconds $SECONDS_PER_POINT \
            --out $O/tune-$tune > $O/tune-$tune.log 2>&1
        echo "exit $?"; grep -E "^  minilm" $O/tune-$tune.log
    done
fi

if has torch; then
    stamp "torch"
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
    timeout $TORCH_TIMEOUT python3 $D/torch_baseline.py --device cuda --minilm $M --compiled-only \
        --compile-modes ${COMPILE_MODES:-reduce-overhead,default,eager} --mask-variants mask --mix \
        --forward-batches 64,512 --seconds $SECONDS_PER_POINT --out $O/torch > $O/torch.log 2>&1
    echo "torch exit $?"
fi

stamp "done"
tar czf $OUT/s7.tgz -C /tmp o
cp $O/tests.txt $O/ncu-*.txt $OUT/ 2>/dev/null
cat $O/tests.txt 2>/dev/null
if has torch; then
    python3 $D/compare.py --compiled $O/ours/streampool.json $O/torch/pytorch-compiled.jsonl 2>&1 | tee $O/table.md
    cp $O/table.md $OUT/
fi
