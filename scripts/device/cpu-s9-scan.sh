#!/usr/bin/env bash
# cpu-s9-scan.sh: why MiniLM's f32 products reach ~60% of the 16-core host's FMA peak
# (#24, session 9). One product at a time through the tensor API (`cpu_gemm` example) at
# 1, 2, 4, 8 and 16 pool threads, then the scheduling and blocking knobs at 16 threads,
# then the forward (32 and 128 tokens, batch 64) before / after.
# Carry [".dev-s9-cpu", ".dev/minilm-fp16"] (cpu_gemm.xz, streampool-before.xz,
# streampool-after.xz, this script). Usage there: bash .dev-s9-cpu/cpu-s9-scan.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev-s9-cpu; B=/tmp/s9; mkdir -p $B
for f in cpu_gemm streampool-before streampool-after; do
  [ -f $D/$f.xz ] || continue
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" $D/$f.xz $B/$f
  chmod +x $B/$f
done
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|MHz|L1d|L2|L3|NUMA"; uptime; nproc; } > $OUT/host.txt 2>&1
cat $OUT/host.txt
scan() { # label, env...
  local label=$1; shift
  env "$@" $B/cpu_gemm 2>&1 | sed "s/^/[$label] /"
}
{
  for t in 1 2 4 8 16; do scan "t$t" STREAMPOOL_CPU_THREADS=$t CPU_GEMM_REPS=$((t < 4 ? 5 : 20)); done
  scan pieces STREAMPOOL_CPU_SGEMM_SCHED=pieces
  scan guided2 STREAMPOOL_CPU_THREADS=16
  for kc in 192 256; do scan "kc$kc" STREAMPOOL_CPU_SGEMM_KC=$kc; done
  for kib in 128 512; do scan "kib$kib" STREAMPOOL_CPU_SGEMM_BLOCK_KIB=$kib; done
  scan kc192-kib128 STREAMPOOL_CPU_SGEMM_KC=192 STREAMPOOL_CPU_SGEMM_BLOCK_KIB=128
  scan t1-kc192 STREAMPOOL_CPU_THREADS=1 CPU_GEMM_REPS=5 STREAMPOOL_CPU_SGEMM_KC=192
  scan t16-again STREAMPOOL_CPU_THREADS=16
} > $OUT/scan.log 2>&1
M=.dev/minilm-fp16
for r in 1; do
  for v in before after after-pieces; do
    [ $v = before ] && [ ! -x $B/streampool-before ] && continue
    case $v in before) bin=$B/streampool-before; e=();; after) bin=$B/streampool-after; e=();;
      after-pieces) bin=$B/streampool-after; e=(STREAMPOOL_CPU_SGEMM_SCHED=pieces);; esac
    env "${e[@]}" $bin bench --device cpu --workloads minilm32,minilm128 --forward-batches 64 --seconds 2 \
      --minilm $M --scenarios forward --dtypes f32 --out /tmp/o-$v-$r 2>&1 | grep -E "rows/s" | sed "s/^ */[$v r$r] /"
  done
done > $OUT/forward.log 2>&1
cat $OUT/forward.log
grep -E "^\[(t1|t16|pieces|guided2|kc192|t1-kc192)\]" $OUT/scan.log
