#!/usr/bin/env bash
# Issue 20 on the H100, in one device call: ours (MiniLM f16 forward at 32/128/256/512 tokens
# and the mixed-length workload, batches 64 and 512) side by side with PyTorch eager and
# torch.compile (default, reduce-overhead) on the same points; optionally an ncu kernel table
# of our forward and the CUDA test suites.
#
# Build here (no CUDA needed to build):
#   cargo build --release -p streampool-cli --features cuda
#   cargo build --release -p streampool-nn --features cuda --example minilm_phases
#   mkdir -p .dev && strip -o .dev/streampool target/release/streampool && \
#     strip -o .dev/minilm_phases target/release/examples/minilm_phases && \
#     xz -f .dev/streampool .dev/minilm_phases
# with MiniLM's fp16 folder in .dev/minilm-fp16 (see /work/shared/DEVICE.md); then, as the
# command of a device run with carry [".dev"]:
#   bash scripts/device/compiled-s6.sh [STEPS]
# STEPS (comma-separated, default ours,ncu,torch): ours, ncu (ncu tables at 512 x 128 and
# 64 x 512), torch (eager, default, reduce-overhead), autotune (max-autotune at 128 x 512
# only), tests (CUDA suites from .dev/tests/*.xz, compute-sanitizer on the new kernels).
# Everything goes to /tmp/o, tarred into $OUT/s6.tgz; the side-by-side table is printed last.
set -u
STEPS=${1:-ours,ncu,torch}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-1.0}
TORCH_TIMEOUT=${TORCH_TIMEOUT:-400}
M=.dev/minilm-fp16
O=/tmp/o
mkdir -p $O
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
has() { [[ ",$STEPS," == *",$1,"* ]]; }
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2" && chmod +x "$2"; }
for b in streampool minilm_phases; do [ -f .dev/$b.xz ] && unxz .dev/$b.xz .dev/$b; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $O/gpu.txt 2>&1
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }

if has tests; then
    stamp "tests"
    mkdir -p .dev/t
    for f in .dev/tests/*.xz; do unxz "$f" ".dev/t/$(basename "$f" .xz)"; done
    export STREAMPOOL_MINILM_DIR=$PWD/$M
    # The test binaries read their data files at the path they were built in.
    [ -n "${BUILT_IN:-}" ] && mkdir -p "$(dirname "$BUILT_IN")" && ln -sfn "$(pwd -P)/${REPO_FROM_HERE:-.}" "$BUILT_IN"
    for t in .dev/t/*; do
        timeout 240 "$t" --test-threads 1 --nocapture > $O/test-$(basename "$t").log 2>&1
        echo "$(basename "$t"): exit $? $(grep -E '^test result' $O/test-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
    done
    if [ -n "${SANITIZE:-}" ]; then
        for t in .dev/t/*; do
            case "$(basename "$t")" in cuda-*) ;; *) continue ;; esac
            timeout 200 compute-sanitizer --tool memcheck "$t" --test-threads 1 $SANITIZE > $O/memcheck-$(basename "$t").log 2>&1
            echo "memcheck $(basename "$t"): exit $? $(grep -E 'ERROR SUMMARY' $O/memcheck-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
            timeout 200 compute-sanitizer --tool racecheck "$t" --test-threads 1 $SANITIZE > $O/racecheck-$(basename "$t").log 2>&1
            echo "racecheck $(basename "$t"): exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' $O/racecheck-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
        done
    fi
fi

if has ours; then
    stamp "ours"
    timeout 200 .dev/streampool bench --device cuda --minilm $M --dtype f16 \
        --workloads minilm32,minilm128,minilm256,minilm512,minilm-mix --scenarios forward \
        --forward-batches 64,512 --seconds $SECONDS_PER_POINT --out $O/ours > $O/ours.log 2>&1
    echo "ours exit $?"; grep -E "forward" $O/ours.log | grep -v "^ " | tail -14
fi

if has ncu; then
    for shape in ${NCU_SHAPES:-512x128 64x512 512x32}; do
        b=${shape%x*}; s=${shape#*x}
        stamp "ncu $shape"
        timeout 150 ncu --csv --metrics gpu__time_duration.sum .dev/minilm_phases $M --device cuda \
            --dtype f16 --batches $b --seqs $s --loop-forward 3 > $O/ncu-$shape.csv 2>&1
        python3 scripts/device/ncu_summary.py $O/ncu-$shape.csv 3 > $O/ncu-$shape.txt 2>&1
        head -14 $O/ncu-$shape.txt
    done
fi

if has torch || has autotune; then
    export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
    if [ -f .dev/inductor.tgz ]; then mkdir -p /tmp/inductor && tar xzf .dev/inductor.tgz -C /tmp; fi
fi
if has torch; then
    stamp "torch"
    # Compiled modes ran 1.8-20x faster with the mask than without on the H100 (call 1 of
    # 2026-11-24), eager about alike: the masked form of every mode, and eager without it.
    timeout $TORCH_TIMEOUT python3 bench/torch_baseline.py --device cuda --minilm $M --compiled-only \
        --compile-modes ${COMPILE_MODES:-reduce-overhead,default,eager} --mask-variants mask --mix \
        --forward-batches 64,512 --seconds $SECONDS_PER_POINT --out $O/torch > $O/torch.log 2>&1
    echo "torch exit $?"
    timeout 120 python3 bench/torch_baseline.py --device cuda --minilm $M --compiled-only \
        --compile-modes eager --mask-variants none --forward-batches 64,512 \
        --seconds $SECONDS_PER_POINT --out $O/torch > $O/torch-eager-nomask.log 2>&1
    echo "torch eager (no mask) exit $?"
fi
if has autotune; then
    stamp "max-autotune"
    timeout ${AUTOTUNE_TIMEOUT:-240} python3 bench/torch_baseline.py --device cuda --minilm $M --compiled-only \
        --compile-modes max-autotune --compile-seqs 128 --forward-batches 512 \
        --seconds $SECONDS_PER_POINT --out $O/torch > $O/autotune.log 2>&1
    echo "max-autotune exit $?"; grep -E "compiled|FAILED" $O/autotune.log | tail -3
fi
if has torch || has autotune; then
    tar czf $OUT/inductor.tgz -C /tmp inductor 2>/dev/null
    ls -la $OUT/inductor.tgz
    grep -E "compile_s" $O/torch/pytorch-compiled.jsonl 2>/dev/null \
        | python3 -c "import json,sys; [print(r['mode'], r['workload'], r['batch'], 'compile', r['compile_s'], 's') for r in map(json.loads, sys.stdin)]" | head -40
fi

stamp "done"
tar czf $OUT/s6.tgz -C /tmp o
cat $O/tests.txt 2>/dev/null
python3 bench/compare.py --compiled $O/ours/streampool.json $O/torch/pytorch-compiled.jsonl 2>&1 | tee $O/table.md
cp $O/table.md $OUT/ 2>/dev/null
