#!/usr/bin/env bash
# merged-s9.sh: session 9's merged main on the H100 machine, one call.
#   1. The CUDA suites (core, graphs, kernel cache, models) with the merged build, and
#      compute-sanitizer racecheck of the session-9 pool kernel (the helper's run stopped on a
#      sanitizer-internal error).
#   2. The CPU allocator suite on the 16-core host.
#   3. The `streampool` wgpu suite in parallel, twice (H100 through Vulkan).
#   4. Issue #20's point, 128 tokens at batches 64 and 512: ours three runs around one
#      torch.compile reduce-overhead run.
#   5. The merged CPU path on the 16-core host, f32 forward at 32 and 128 tokens batch 64 (a
#      check that the merge kept the #24 helper's figures; the ratios are in cpu-2026-11-25-s9).
#   6. The served path (scripts/device/served-s5.sh), text in, vectors out.
# Two calls back to back (the carry limit, 64 MiB with the tracked files, does not hold the
# model, the CLI and the test binaries at once). Binaries are unpacked into /tmp/keep, which a
# warm machine keeps between calls, so the second call finds the first call's test binaries
# (and the Vulkan loader it installed); a step runs when its binaries are there:
#   D=.dev-s9-b bash scripts/device/merged-s9.sh   carry [".dev-s9-b", ".gl"]: tests/*.xz
#     (stripped: cuda, cuda_graphs, cuda_kernel_cache, allocator, wgpu, wgpu_profile, nn-wgpu)
#     and the Vulkan loader debs: steps 1 (not the models), 2, 3 (not MiniLM).
#   D=.dev bash scripts/device/merged-s9.sh        carry [".dev"]: .dev/streampool.xz (cargo
#     build --release -p streampool-cli --features cuda,wgpu, stripped), .dev/tests/nn-cuda.xz,
#     .dev/minilm-fp16: steps 1 (models), 3 (MiniLM on wgpu), 4, 5, 6.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
D=${D:-.dev}
# Unpacked into /tmp/keep (see above): the second call uses the first call's test binaries.
BIN=/tmp/keep; mkdir -p $BIN
[ -f $D/streampool.xz ] && unxz_to $D/streampool.xz $BIN/streampool
for f in $D/tests/*.xz; do unxz_to "$f" "$BIN/$(basename "$f" .xz)"; done
has() { [ -e "$1" ]; }
M=$PWD/.dev/minilm-fp16
MODEL=0; [ -d $M ] && MODEL=1
export STREAMPOOL_MINILM_DIR=$M
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
O=/tmp/o-$(basename $D); rm -rf $O; mkdir -p $O/tests

# 1. CUDA suites.
for name in cuda cuda_graphs cuda_kernel_cache nn-cuda; do
  has $BIN/$name || continue
  # The model suite needs the model (second call); the others run once, in the first call.
  case $name in nn-*) [ $MODEL = 1 ] || continue;; *) [ $MODEL = 0 ] || continue;; esac
  case $name in nn-*) dir=crates/streampool-nn;; *) dir=crates/streampool;; esac
  (cd $dir && timeout 300 $BIN/$name --test-threads 4 > $O/tests/$name.log 2>&1)
  echo "$name rc=$? $(grep -E '^test result' $O/tests/$name.log | tail -1)" | tee -a $O/summary.txt
done
has $BIN/nn-cuda && grep -hE "cosine" $O/tests/nn-cuda.log | head -6
if has $BIN/cuda && [ $MODEL = 0 ]; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  (cd crates/streampool && timeout 100 $CS --tool racecheck --kernel-name regex:sp_pool_rows $BIN/cuda \
    half_ops_match_the_cpu_backend --test-threads 1 > $O/tests/racecheck-pool.log 2>&1)
  echo "racecheck sp_pool_rows rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|Internal' $O/tests/racecheck-pool.log | tr '\n' ' ')" | tee -a $O/summary.txt
fi
stamp "CUDA suites"

# 2. The CPU allocator suite on this host (default test threads).
if has $BIN/allocator && [ $MODEL = 0 ]; then
  (cd crates/streampool && timeout 120 $BIN/allocator > $O/tests/allocator-cpu.log 2>&1)
  echo "allocator (cpu) rc=$? $(grep -E '^test result' $O/tests/allocator-cpu.log | tail -1)" | tee -a $O/summary.txt
  stamp "allocator"
fi

# 3. The wgpu suite in parallel, twice, and the profile's test (first call); the MiniLM model
#    suite on wgpu (second call: the real weights, f32 and f16 against sentence-transformers).
[ -d .gl ] && for f in .gl/*.deb; do dpkg -x $f /; done && ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
if [ $MODEL = 0 ] && has $BIN/wgpu; then
  for i in 1 2; do
    s=$(date +%s.%N)
    (cd crates/streampool && timeout 90 $BIN/wgpu > $O/tests/wgpu-parallel-$i.log 2>&1); rc=$?
    echo "wgpu parallel run $i rc=$rc $(grep -E '^test result' $O/tests/wgpu-parallel-$i.log | tail -1) wall $(python3 -c "import time; print(round(time.time()-$s,1))") s" | tee -a $O/summary.txt
  done
  (cd crates/streampool && timeout 90 $BIN/wgpu_profile > $O/tests/wgpu_profile.log 2>&1)
  echo "wgpu_profile rc=$? $(grep -E '^test result' $O/tests/wgpu_profile.log | tail -1)" | tee -a $O/summary.txt
fi
if [ $MODEL = 1 ] && has $BIN/nn-wgpu; then
  (cd crates/streampool-nn && timeout 120 $BIN/nn-wgpu --nocapture > $O/tests/nn-wgpu.log 2>&1)
  echo "nn-wgpu rc=$? $(grep -E '^test result' $O/tests/nn-wgpu.log | tail -1)" | tee -a $O/summary.txt
  grep -E "wgpu MiniLM" $O/tests/nn-wgpu.log | tee -a $O/summary.txt
fi
unset VK_DRIVER_FILES
stamp "wgpu"

# 4. #20 at 128 tokens: ours three times, torch.compile reduce-overhead once in the middle.
ours() {
  timeout 90 $BIN/streampool bench --device cuda --minilm $M --dtype f16 --workloads minilm128 \
    --scenarios forward --forward-batches 64,512 --seconds 3 --out $O/$1 > $O/$1.log 2>&1
  echo "$1 exit $?: $(grep -E '^  minilm128' $O/$1.log | tr -s ' ' | tr '\n' ';')" | tee -a $O/summary.txt
}
if has $BIN/streampool && [ $MODEL = 1 ]; then
ours ours1
ours ours2
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
timeout 240 python3 bench/torch_baseline.py --device cuda --minilm $M --compiled-only \
  --compile-modes reduce-overhead --mask-variants mask --compile-seqs 128 \
  --forward-batches 64,512 --seconds 3 --out $O/torch > $O/torch.log 2>&1
echo "torch exit $?"; grep -E "forward|reduce" $O/torch.log | tail -4 | tee -a $O/summary.txt
ours ours3
for r in ours1 ours2 ours3; do
  python3 bench/compare.py --compiled $O/$r/streampool.json $O/torch/pytorch-compiled.jsonl > $O/table-$r.md 2>&1
  echo "$r: $(grep -E '^\| minilm128' $O/table-$r.md | tr '\n' ' ')" | tee -a $O/summary.txt
done
stamp "#20"
fi

# 5. The merged CPU path on this host.
if has $BIN/streampool && [ $MODEL = 1 ]; then
  timeout 120 $BIN/streampool bench --device cpu --minilm $M --dtypes f32 --workloads minilm32,minilm128 \
    --scenarios forward --forward-batches 64 --seconds 3 --out $O/cpu > $O/cpu.log 2>&1
  echo "cpu exit $?: $(grep -E '^  minilm' $O/cpu.log | tr -s ' ' | tr '\n' ';')" | tee -a $O/summary.txt
  stamp "cpu"
fi

# 6. The served path.
[ $MODEL = 1 ] && has $BIN/streampool && B=$BIN/streampool DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} OUT=$O/served timeout 300 bash scripts/device/served-s5.sh > $O/served.log 2>&1; rc=$?
[ $MODEL = 1 ] && has $BIN/streampool && { echo "served exit $rc"; tail -12 $O/served/summary.md; stamp "served"; }

tar czf $OUT/merged-s9-$(basename $D).tgz -C /tmp $(basename $O)
cp $O/summary.txt $OUT/; cp $O/served/summary.md $OUT/served-summary.md 2>/dev/null
cat $O/summary.txt
