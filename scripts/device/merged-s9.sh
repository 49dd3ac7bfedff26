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
# Two calls (the carry limit, 64 MiB with the tracked files, does not hold both at once); a
# step runs when its binaries are in the carry:
#   D=.dev bash scripts/device/merged-s9.sh        carry [".dev"]: .dev/streampool.xz (cargo
#     build --release -p streampool-cli --features cuda,wgpu, stripped), .dev/tests/*.xz
#     (stripped cuda, nn-cuda), .dev/minilm-fp16: steps 1, 4, 5, 6.
#   D=.dev-s9-b bash scripts/device/merged-s9.sh   carry [".dev-s9-b", ".gl"]: tests/wgpu.xz,
#     tests/allocator.xz, tests/cuda_graphs.xz, tests/cuda_kernel_cache.xz and .gl (the Vulkan
#     loader debs): steps 1 (graphs, kernel cache), 2, 3.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
D=${D:-.dev}
# Unpacked per call (a warm machine keeps ignored files between calls: no stale binary).
BIN=/tmp/bin-$$; mkdir -p $BIN
[ -f $D/streampool.xz ] && unxz_to $D/streampool.xz $BIN/streampool
for f in $D/tests/*.xz; do unxz_to "$f" "$BIN/$(basename "$f" .xz)"; done
has() { [ -e "$1" ]; }
M=$PWD/.dev/minilm-fp16
export STREAMPOOL_MINILM_DIR=$M
T0=$(date +%s); stamp() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
O=/tmp/o-$(basename $D); rm -rf $O; mkdir -p $O/tests

# 1. CUDA suites.
for name in cuda cuda_graphs cuda_kernel_cache nn-cuda; do
  has $BIN/$name || continue
  case $name in nn-*) dir=crates/streampool-nn;; *) dir=crates/streampool;; esac
  (cd $dir && timeout 300 $BIN/$name --test-threads 4 > $O/tests/$name.log 2>&1)
  echo "$name rc=$? $(grep -E '^test result' $O/tests/$name.log | tail -1)" | tee -a $O/summary.txt
done
has $BIN/nn-cuda && grep -hE "cosine" $O/tests/nn-cuda.log | head -6
if has $BIN/cuda; then
  CS=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -1)
  (cd crates/streampool && timeout 240 $CS --tool racecheck --kernel-name regex:sp_pool_rows $BIN/cuda \
    half_ops_match_the_cpu_backend --test-threads 1 > $O/tests/racecheck-pool.log 2>&1)
  echo "racecheck sp_pool_rows rc=$? $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY|Internal' $O/tests/racecheck-pool.log | tr '\n' ' ')" | tee -a $O/summary.txt
fi
stamp "CUDA suites"

# 2. The CPU allocator suite on this host (default test threads).
if has $BIN/allocator; then
  (cd crates/streampool && timeout 120 $BIN/allocator > $O/tests/allocator-cpu.log 2>&1)
  echo "allocator (cpu) rc=$? $(grep -E '^test result' $O/tests/allocator-cpu.log | tail -1)" | tee -a $O/summary.txt
  stamp "allocator"
fi

# 3. The wgpu suite in parallel, three times.
has $BIN/wgpu && for f in .gl/*.deb; do dpkg -x $f /; done && ldconfig
export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json XDG_RUNTIME_DIR=/tmp
has $BIN/wgpu && for i in 1 2; do
  s=$(date +%s.%N)
  (cd crates/streampool && timeout 90 $BIN/wgpu > $O/tests/wgpu-parallel-$i.log 2>&1); rc=$?
  echo "wgpu parallel run $i rc=$rc $(grep -E '^test result' $O/tests/wgpu-parallel-$i.log | tail -1) wall $(python3 -c "import time; print(round(time.time()-$s,1))") s" | tee -a $O/summary.txt
done
unset VK_DRIVER_FILES
stamp "wgpu"

# 4. #20 at 128 tokens: ours three times, torch.compile reduce-overhead once in the middle.
ours() {
  timeout 90 $BIN/streampool bench --device cuda --minilm $M --dtype f16 --workloads minilm128 \
    --scenarios forward --forward-batches 64,512 --seconds 3 --out $O/$1 > $O/$1.log 2>&1
  echo "$1 exit $?: $(grep -E '^  minilm128' $O/$1.log | tr -s ' ' | tr '\n' ';')" | tee -a $O/summary.txt
}
if has $BIN/streampool; then
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
if has $BIN/streampool; then
  timeout 120 $BIN/streampool bench --device cpu --minilm $M --dtypes f32 --workloads minilm32,minilm128 \
    --scenarios forward --forward-batches 64 --seconds 3 --out $O/cpu > $O/cpu.log 2>&1
  echo "cpu exit $?: $(grep -E '^  minilm' $O/cpu.log | tr -s ' ' | tr '\n' ';')" | tee -a $O/summary.txt
  stamp "cpu"
fi

# 6. The served path.
has $BIN/streampool && B=$BIN/streampool DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} OUT=$O/served timeout 300 bash scripts/device/served-s5.sh > $O/served.log 2>&1; rc=$?
has $BIN/streampool && { echo "served exit $rc"; tail -12 $O/served/summary.md; stamp "served"; }

tar czf $OUT/merged-s9-$(basename $D).tgz -C /tmp $(basename $O)
cp $O/summary.txt $OUT/; cp $O/served/summary.md $OUT/served-summary.md 2>/dev/null
cat $O/summary.txt
