#!/usr/bin/env bash
# cpu-s8-rounds.sh: issue #24's f32 targets on the H100 machine's 16-core host, settled against
# the host's noise: three rounds, each streampool (session 8's merged main) then PyTorch eager
# f32 + sentence-transformers encode, the same points, the same fp16-stored MiniLM weights
# upcast to f32 on both sides; a table per round and the medians.
# Carry [".dev"] (.dev/streampool.xz: the release CLI under test; .dev/minilm-fp16).
# Usage there: bash scripts/device/cpu-s8-rounds.sh   (writes under $OUT)
# A before/after comparison in the same rounds: stage the earlier CLI first, in a call just
# before on the same (warm) machine: carry [".dev-s8-b"] and run
# `STAGE=before bash scripts/device/cpu-s8-rounds.sh` (unpacks .dev-s8-b/streampool.xz to
# /tmp/keep/before); each round then runs it too, before ours.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
M=.dev/minilm-fp16; SECS=${SECS:-2}; ROUNDS=${ROUNDS:-3}
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
if [ "${STAGE:-}" = before ]; then
  mkdir -p /tmp/keep && unxz_to .dev-s8-b/streampool.xz /tmp/keep/before && ls -l /tmp/keep; exit 0
fi
unxz_to .dev/streampool.xz /tmp/sp-cpu
W=/tmp/rounds; rm -rf $W; mkdir -p $W
{ lscpu | grep -E "Model name|^CPU\(s\)"; uptime; } | tee $W/host.txt
for r in $(seq 1 $ROUNDS); do
  if [ -x /tmp/keep/before ]; then
    /tmp/keep/before bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS \
      --minilm $M --scenarios forward --dtypes f32 --out $W/before-$r > $W/before-$r.log 2>&1
    echo "round $r before rc=$?: $(grep -E '^  minilm.*forward' $W/before-$r.log | sed 's/ *minilm/minilm/; s/, p50.*//' | tr '\n' ';')"
  fi
  /tmp/sp-cpu bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS \
    --minilm $M --scenarios forward,ceiling --ceiling-batches 64 --dtypes f32 --out $W/ours-$r > $W/ours-$r.log 2>&1
  echo "round $r ours rc=$? ($(uptime | sed 's/.*load/load/')): $(grep -E '^  minilm.*forward' $W/ours-$r.log | sed 's/ *minilm/minilm/; s/, p50.*//' | tr '\n' ';')"
  python3 bench/torch_baseline.py --device cpu --workloads minilm32,minilm128 --dtypes f32 --dtype-only \
    --forward-batches 1,64 --seconds $SECS --minilm $M --out $W/torch-$r > $W/torch-$r.log 2>&1
  echo "round $r torch rc=$?"
  python3 bench/cpu_compare.py $W/ours-$r/streampool.json $W/torch-$r/pytorch.json > $W/compare-$r.md 2>&1
  grep -E "^\| (32|128) " $W/compare-$r.md | grep -v bf16
done
python3 - $W $ROUNDS <<'PY' | tee $W/medians.md
import json, sys, statistics
w, n = sys.argv[1], int(sys.argv[2])
def pts(path, key):
    out = {}
    for r in json.load(open(path))[key]:
        if (r.get("dtype") or "f32") == "f32":
            out[(r["workload"], r["scenario"], r["batch"])] = r["throughput_per_s"]
    return out
import os
rows, before = {}, {}
for i in range(1, n + 1):
    o = pts(f"{w}/ours-{i}/streampool.json", "results")
    t = pts(f"{w}/torch-{i}/pytorch.json", "results")
    bp = f"{w}/before-{i}/streampool.json"
    b = pts(bp, "results") if os.path.exists(bp) else {}
    for k, v in o.items():
        if k in t:
            rows.setdefault(k, []).append((v, t[k]))
        if k in b:
            before.setdefault(k, []).append(v / b[k])
print("| workload | scenario | batch | ours per round | PyTorch per round | ratio per round | median ratio | ours / before (median) |")
print("|---|---|---:|---|---|---|---:|---:|")
for k in sorted(rows):
    v = rows[k]
    r = [a / b for a, b in v]
    gain = f"{statistics.median(before[k]):.3f}x" if k in before else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {', '.join(f'{a:,.1f}' for a, _ in v)} | {', '.join(f'{b:,.1f}' for _, b in v)} | {', '.join(f'{x:.2f}x' for x in r)} | **{statistics.median(r):.2f}x** | {gain} |")
PY
tar czf $OUT/cpu-rounds.tgz -C /tmp rounds
cp $W/medians.md $W/host.txt $OUT/
