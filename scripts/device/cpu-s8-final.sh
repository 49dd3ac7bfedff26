#!/usr/bin/env bash
# cpu-s8-final.sh: issue 24, session 8, the last call: main's binary (before) against this
# branch's (after: f32 in one pass along k, and in steps of 128, STREAMPOOL_CPU_SGEMM_KC)
# on the f32 miss (MiniLM, 32 tokens, batch 64), three interleaved rounds of 3 s points (the
# host's noise between 1 s points was larger than the difference), then bf16 before/after.
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
run() { # name, binary, dtypes, batches, env...
  local name=$1 bin=$2 dt=$3 bs=$4; shift 4
  env "$@" $bin bench --device cpu --workloads minilm32 --forward-batches $bs --seconds 3 --minilm $M \
    --scenarios forward --dtypes $dt --out /tmp/o-$name 2>&1 | grep -E "forward .*batch" | sed "s/^ */$name: /"
}
{
  for round in 1 2 3; do
    run before /tmp/streampool-before f32 64
    run after-kc0 /tmp/streampool f32 64 STREAMPOOL_CPU_SGEMM_KC=0
    run after-kc128 /tmp/streampool f32 64 STREAMPOOL_CPU_SGEMM_KC=128
  done
  run before /tmp/streampool-before bf16 1,64
  run after /tmp/streampool bf16 1,64
} | tee "$OUT/final.log"
python3 - "$OUT/final.log" <<'PY'
import re, statistics, sys
rates = {}
for line in open(sys.argv[1]):
    m = re.match(r"(\S+): minilm32 (\w+) forward 1 threads batch (\d+): (\d+) rows/s", line)
    if m:
        rates.setdefault((m[1], m[2], int(m[3])), []).append(int(m[4]))
for k, v in rates.items():
    print(f"{k[0]:12} {k[1]:5} b{k[2]:<3} median {statistics.median(v):6.0f} rows/s  {v}")
PY
