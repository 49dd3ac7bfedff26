#!/usr/bin/env bash
# Issue 20, session 8, on the H100: this branch (16-byte index_select, 1 MiB upload-ring
# segments) against main's binary (6442474) and PyTorch, in one device call.
#
# Build here (this branch, then main's checkout into the same target folder):
#   cargo build --release -p streampool-cli --features cuda          (-> $D/streampool.xz)
#   cargo build --release -p streampool-nn --features cuda --example minilm_phases
#   cargo test --release -p streampool --features cuda --test cuda --test cuda_graphs \
#       --test cuda_kernel_cache --no-run; cargo test ... -p streampool-nn --test cuda --no-run
#   (main, 6442474) cargo build --release -p streampool-cli --features cuda (-> $D/base.xz)
# every binary stripped and xz'd into $D (tests under $D/tests), MiniLM's fp16 folder in
# $D/minilm with model.safetensors xz'd (`xz --lzma2=preset=6,lc=1,lp=1,pb=1`: 39 MB, so all
# of it fits the 64 MiB carry), and bench/torch_baseline.py, bench/compare.py,
# scripts/device/ncu_summary.py and this script copied into $D. Then, as the command of a
# device run with carry [".dev-s8-cuda"]:
#   DEADLINE=SECONDS bash .dev-s8-cuda/s8.sh STEPS
# STEPS, comma-separated, run in this order:
#   tests  the CUDA suites, compute-sanitizer memcheck + racecheck on
#          attention_to_128_keys_and_chunked_gather_match_cpu (the new gather kernel)
#   ours   `streampool bench` forward at 32/128/256/512 tokens and the mix, batches 64 and 512:
#          ours, main's, ours, main's, ours (alternating, to see the spread)
#   ncu    kernel table of ours at 512 x 128, clocks locked (ncu's default) and not
#   torch  PyTorch reduce-overhead, default, eager (in that order) until the deadline
# Narrower calls: TESTS (a glob of test binaries), SANITIZE (tools, or empty for none),
# OURS_W and RUNS (workloads and runs of the ours step), COMPILE_MODES, TORCH_SEQS and
# TORCH_MIX (empty: no mixed workload) for the torch step.
# Steps that would start past DEADLINE seconds (default 540) are skipped and say so; the
# torch step gets what is left. Everything goes to /tmp/o, tarred into $OUT/s8.tgz; the
# side-by-side table is printed last.
set -u
STEPS=${1:-tests}
D=${D:-.dev-s8-cuda}
DEADLINE=${DEADLINE:-540}
SECONDS_PER_POINT=${SECONDS_PER_POINT:-1.0}
O=/tmp/o
mkdir -p $O
t0=$(date +%s)
left() { echo $((DEADLINE - ($(date +%s) - t0))); }
stamp() { echo "[$(($(date +%s) - t0)) s] $*"; }
has() { [[ ",$STEPS," == *",$1,"* ]]; }
# Runs step $1 only with at least $2 seconds left.
room() { if [ "$(left)" -lt "$2" ]; then stamp "skip $1: $(left) s left" | tee -a $O/skipped.txt; return 1; fi; }
unxz() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2" && chmod +x "$2"; }

SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
M=/tmp/minilm
mkdir -p $M && cp -r $D/minilm/. $M/ && rm -f $M/model.safetensors.xz
python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/minilm/model.safetensors.xz'), open('$M/model.safetensors','wb'))"
for b in streampool base minilm_phases; do [ -f $D/$b.xz ] && unxz $D/$b.xz /tmp/$b; done
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv > $O/gpu.txt 2>&1
stamp "setup"

if has tests && room tests 60; then
    mkdir -p /tmp/t
    for f in $D/tests/*.xz; do unxz "$f" "/tmp/t/$(basename "$f" .xz)"; done
    export STREAMPOOL_MINILM_DIR=$M
    # The test binaries read their data files under the folder they were built in.
    mkdir -p /work && ln -sfn "$PWD" /work/wt-s8-cuda
    for t in /tmp/t/${TESTS:-*}; do
        timeout 200 "$t" --test-threads 1 --nocapture > $O/test-$(basename "$t").log 2>&1
        echo "$(basename "$t"): exit $? $(grep -E '^test result' $O/test-$(basename "$t").log | tail -1)" | tee -a $O/tests.txt
    done
    core=/tmp/t/cuda
    new=attention_to_128_keys_and_chunked_gather_match_cpu
    grep -hE "attention|embedding" $O/test-cuda.log | head -40
    grep -hE "cosine" $O/test-nn-cuda.log | head -10
    for tool in ${SANITIZE-memcheck racecheck}; do
        room "sanitize $tool" 40 || continue
        timeout $(( $(left) < 150 ? $(left) - 20 : 130 )) compute-sanitizer --tool $tool \
            $core --test-threads 1 $new > $O/$tool.log 2>&1
        echo "$tool $new: exit $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|test result' $O/$tool.log | tr '\n' ' ')" | tee -a $O/tests.txt
    done
    stamp "tests done"
fi

bench() {  # bench BINARY OUT [ENV=VALUE...] -- workloads batches
    local bin=$1 out=$2; shift 2
    env "$@" STREAMPOOL_CUBLASLT_TUNE_LOG=1 timeout 90 /tmp/$bin bench --device cuda --minilm $M --dtype f16 \
        --workloads $W --scenarios forward --forward-batches $B --seconds $SECONDS_PER_POINT --out $O/$out \
        > $O/$out.log 2>&1
    echo "$out exit $?"
    grep -E "^  minilm" $O/$out.log | sed "s/^/  $out /"
}

if has ours; then
    W=${OURS_W:-minilm32,minilm128,minilm256,minilm512,minilm-mix} B=64,512
    for run in ${RUNS:-ours1:streampool base1:base ours2:streampool base2:base ours3:streampool base3:base}; do
        IFS=: read name bin <<< "$run"
        room "$name" 45 || continue
        stamp "$name"
        bench $bin $name X=1
    done
fi

if has ncu; then
    for clocks in base none; do
        room "ncu $clocks" 40 || continue
        stamp "ncu 512x128 clocks $clocks"
        timeout 120 ncu --clock-control $clocks --csv --metrics gpu__time_duration.sum /tmp/minilm_phases $M \
            --device cuda --dtype f16 --batches 512 --seqs 128 --loop-forward 4 > $O/ncu-512x128-$clocks.csv 2>&1
        python3 $D/ncu_summary.py $O/ncu-512x128-$clocks.csv 3 --tail > $O/ncu-512x128-$clocks.txt 2>&1
        head -14 $O/ncu-512x128-$clocks.txt
    done
    room phases 20 && /tmp/minilm_phases $M --device cuda --dtype f16 --batches 64,512 --seqs 128 --iters 40 \
        > $O/phases.txt 2>&1 && cat $O/phases.txt
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
tar czf $OUT/s8.tgz -C /tmp o
cp $O/tests.txt $O/ncu-512x128-*.txt $OUT/ 2>/dev/null
cat $O/tests.txt $O/skipped.txt 2>/dev/null
for f in $O/ours*.log $O/base*.log; do [ -f "$f" ] && grep -E "^  minilm" "$f" | sed "s|^|$(basename $f .log) |"; done > $O/runs.txt
cp $O/runs.txt $OUT/
if [ -f $O/torch/pytorch-compiled.jsonl ]; then
    for r in ours1 base1; do
        [ -f $O/$r/streampool.json ] || continue
        python3 $D/compare.py --compiled $O/$r/streampool.json $O/torch/pytorch-compiled.jsonl > $O/table-$r.md 2>&1
        cp $O/table-$r.md $OUT/
    done
    grep -E "^\| minilm" $O/table-ours1.md
fi
