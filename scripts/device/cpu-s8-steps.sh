#!/usr/bin/env bash
# cpu-s8-steps.sh: issue 24, session 8: the f32 miss (MiniLM, 32 tokens, batch 64) on the GPU
# machine's host CPU, main's binary against this branch's with its tuning knobs (steps along
# k, STREAMPOOL_CPU_SGEMM_KC; rows per block, STREAMPOOL_CPU_SGEMM_BLOCK_KIB), interleaved.
# Carry: D=.dev-s8-cpu with streampool-before.xz, streampool.xz, this script; .dev/minilm-fp16.
set -uo pipefail
OUT=${OUT:-/tmp/out}
D=${D:-.dev-s8-cpu}
M=${M:-.dev/minilm-fp16}
mkdir -p "$OUT"
for f in streampool streampool-before; do
  python3 -c "import lzma,shutil; shutil.copyfileobj(lzma.open('$D/$f.xz'), open('/tmp/$f','wb'))"
  chmod +x /tmp/$f
done
B="--device cpu --workloads minilm32 --forward-batches 64 --seconds 1 --minilm $M --scenarios forward --dtypes f32"
point() { # name, binary, env...
  local name=$1 bin=$2; shift 2
  env "$@" $bin bench $B --out /tmp/o-$name 2>&1 | grep -E "forward .*batch 64" | sed "s/^ */$name: /"
}
{
  point before /tmp/streampool-before
  point after-kc0 /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=0
  point after-kc128 /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=128
  point after-kc192 /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=192
  point after-kc128-kib128 /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=128 STREAMPOOL_CPU_SGEMM_BLOCK_KIB=128
  point before-again /tmp/streampool-before
  point after-kc0-again /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=0
  point after-kc128-again /tmp/streampool STREAMPOOL_CPU_SGEMM_KC=128
} | tee "$OUT/steps.log"
