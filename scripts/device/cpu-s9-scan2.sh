#!/usr/bin/env bash
# cpu-s9-scan2.sh: #24 session 9, second call on the 16-core host. The blocking and
# scheduling knobs of the f32 products and the attention path, each product alone through
# the tensor API (`cpu_gemm` example), three interleaved rounds (the host is noisy at the
# millisecond); the microkernel at 1 thread; then MiniLM's forward at batch 64, before
# (main at 8b6eb79) / after under a few settings, three interleaved rounds.
# Carry [".dev-s9-cpu", ".dev/minilm-fp16"]. Usage there: bash .dev-s9-cpu/cpu-s9-scan2.sh
set -uo pipefail
export CPU_GEMM_SHAPES=2048x1152x384,2048x384x384,2048x1536x384:gelu,2048x384x1536,attn64x32,attn64x128
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev-s9-cpu; B=/tmp/s9; mkdir -p $B
for f in cpu_gemm streampool-before streampool-after; do
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" $D/$f.xz $B/$f
  chmod +x $B/$f
done
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|L1d|L2"; uptime; } > $OUT/host.txt 2>&1
# name=env settings (space-separated), run with `env`
CONFIGS=(
  "base="
  "pieces=STREAMPOOL_CPU_SGEMM_SCHED=pieces"
  "kc128=STREAMPOOL_CPU_SGEMM_KC=128"
  "kc192=STREAMPOOL_CPU_SGEMM_KC=192"
  "kc256=STREAMPOOL_CPU_SGEMM_KC=256"
  "kc192-kib512=STREAMPOOL_CPU_SGEMM_KC=192 STREAMPOOL_CPU_SGEMM_BLOCK_KIB=512"
  "kc256-kib512=STREAMPOOL_CPU_SGEMM_KC=256 STREAMPOOL_CPU_SGEMM_BLOCK_KIB=512"
  "units8=STREAMPOOL_CPU_SGEMM_UNITS=8"
  "kc192-units8=STREAMPOOL_CPU_SGEMM_KC=192 STREAMPOOL_CPU_SGEMM_UNITS=8"
  "kc256-units8=STREAMPOOL_CPU_SGEMM_KC=256 STREAMPOOL_CPU_SGEMM_UNITS=8"
  "attn-gemm=STREAMPOOL_CPU_ATTENTION=gemm"
)
for r in 1 2 3; do
  for c in "${CONFIGS[@]}"; do
    name=${c%%=*}; e=${c#*=}
    env $e $B/cpu_gemm 2>&1 | sed "s/^/[$name r$r] /"
  done
done > $OUT/scan16.log 2>&1
for c in "base=" "kc192=STREAMPOOL_CPU_SGEMM_KC=192" "kc256=STREAMPOOL_CPU_SGEMM_KC=256" "kc128=STREAMPOOL_CPU_SGEMM_KC=128"; do
  name=${c%%=*}; e=${c#*=}
  env $e STREAMPOOL_CPU_THREADS=1 CPU_GEMM_REPS=4 $B/cpu_gemm 2>&1 | sed "s/^/[t1-$name] /"
done > $OUT/scan1.log 2>&1
M=.dev/minilm-fp16
for r in 1 2 3; do
  for v in "before=" "after=" "after-kc192=STREAMPOOL_CPU_SGEMM_KC=192" "after-kc256=STREAMPOOL_CPU_SGEMM_KC=256" "after-attn-gemm=STREAMPOOL_CPU_ATTENTION=gemm"; do
    name=${v%%=*}; e=${v#*=}; bin=$B/streampool-after; [ $name = before ] && bin=$B/streampool-before
    env $e $bin bench --device cpu --workloads minilm32,minilm128 --forward-batches 64 --seconds 2 \
      --minilm $M --scenarios forward --dtypes f32 --out /tmp/o-$name-$r 2>&1 | grep -E "rows/s" | grep -v workload | sed "s/^ */[$name r$r] /"
  done
done > $OUT/forward.log 2>&1
python3 - $OUT <<'PY' | tee $OUT/summary.md
import re, sys, statistics, collections
out = sys.argv[1]
def table(path, pat, val):
    d = collections.defaultdict(list)
    for line in open(path):
        m = re.match(pat, line)
        if m:
            d[(m.group(1), m.group(2))].append(float(m.group(3)))
    return d
g = table(f"{out}/scan16.log", r"\[(\S+) r\d\] threads +\d+ +(\S+) .*?([\d.]+) GFLOP/s", None)
names = list(dict.fromkeys(k[0] for k in g)); shapes = list(dict.fromkeys(k[1] for k in g))
print("16 threads, GFLOP/s, median of 3 rounds (min-max)")
print("| config | " + " | ".join(shapes) + " |"); print("|---" * (len(shapes) + 1) + "|")
for n in names:
    print(f"| {n} | " + " | ".join(f"{statistics.median(g[(n,s)]):.0f} ({min(g[(n,s)]):.0f}-{max(g[(n,s)]):.0f})" for s in shapes) + " |")
f = table(f"{out}/forward.log", r"\[(\S+) r\d\] (minilm\d+) f32 forward .*?: (\d+) rows/s", None)
print("\nforward batch 64, sentences/s, median of 3 rounds (each round)")
for n in dict.fromkeys(k[0] for k in f):
    print(n, " ".join(f"{w}: {statistics.median(f[(n,w)]):.0f} ({', '.join(f'{x:.0f}' for x in f[(n,w)])})" for w in ("minilm32", "minilm128") if (n, w) in f))
PY
grep -E "GFLOP" $OUT/scan1.log | sed 's/ms\/call.*GFLOP\/s/GF/' 
