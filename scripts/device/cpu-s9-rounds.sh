#!/usr/bin/env bash
# cpu-s9-rounds.sh: #24's f32 targets on the H100 machine's 16-core host, session 9: three interleaved rounds, each main at 8b6eb79 ("before"), this
# branch ("after"; forward and end to end) and PyTorch 2.11 eager f32 + sentence-transformers
# `encode` (bench/torch_baseline.py), the same fp16-stored MiniLM weights upcast to f32 on
# every side; the medians; last a kernel profile of "after" at 32 tokens batch 64.
# Carry [".dev-s9-cpu", ".dev/minilm-fp16"]: .dev-s9-cpu holds streampool-before.xz,
# streampool-after.xz (both `cargo build --release -p streampool-cli --no-default-features`,
# stripped) and this script. (The tests run in a call of their own, cpu-s9-tests.sh: with
# them the carry passed the 64 MiB a call takes.)
# Usage there: bash .dev-s9-cpu/cpu-s9-rounds.sh   (writes under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev-s9-cpu; B=/tmp/s9; mkdir -p $B
M=.dev/minilm-fp16; SECS=${SECS:-2}; ROUNDS=${ROUNDS:-3}
for f in streampool-before streampool-after; do
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" $D/$f.xz $B/$f
  chmod +x $B/$f
done
W=/tmp/rounds; rm -rf $W; mkdir -p $W
{ lscpu | grep -E "Model name|^CPU\(s\)|Thread|L1d|L2|Flags" | sed 's/Flags:.*\(avx512f\).*/flags: avx512f .../'; uptime; } | tee $W/host.txt
for r in $(seq 1 $ROUNDS); do
  $B/streampool-before bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS \
    --minilm $M --scenarios forward --dtypes f32 --out $W/before-$r > $W/before-$r.log 2>&1
  echo "round $r before rc=$?: $(grep -E '^  minilm.*forward' $W/before-$r.log | sed 's/ *minilm/minilm/; s/, p50.*//' | tr '\n' ';')"
  $B/streampool-after bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS \
    --minilm $M --scenarios forward,ceiling --ceiling-batches 64 --dtypes f32 --out $W/ours-$r > $W/ours-$r.log 2>&1
  echo "round $r after rc=$? ($(uptime | sed 's/.*load/load/')): $(grep -E '^  minilm.*forward' $W/ours-$r.log | sed 's/ *minilm/minilm/; s/, p50.*//' | tr '\n' ';')"
  python3 bench/torch_baseline.py --device cpu --workloads minilm32,minilm128 --dtypes f32 --dtype-only \
    --forward-batches 1,64 --seconds $SECS --minilm $M --out $W/torch-$r > $W/torch-$r.log 2>&1
  echo "round $r torch rc=$?"
  python3 bench/cpu_compare.py $W/ours-$r/streampool.json $W/torch-$r/pytorch.json > $W/compare-$r.md 2>&1
done
STREAMPOOL_CPU_PROFILE=1 $B/streampool-after bench --device cpu --workloads minilm32 --forward-batches 64 --seconds 1 \
  --minilm $M --scenarios forward --dtypes f32 --out $W/profile > $W/profile-after.log 2>&1
python3 - $W $ROUNDS <<'PY' | tee $W/medians.md
import json, sys, statistics, os
w, n = sys.argv[1], int(sys.argv[2])
def pts(path):
    out = {}
    for r in json.load(open(path))["results"]:
        if (r.get("dtype") or "f32") == "f32":
            out[(r["workload"], r["scenario"], r["batch"])] = r["throughput_per_s"]
    return out
rows, before = {}, {}
for i in range(1, n + 1):
    o, t = pts(f"{w}/ours-{i}/streampool.json"), pts(f"{w}/torch-{i}/pytorch.json")
    bp = f"{w}/before-{i}/streampool.json"
    b = pts(bp) if os.path.exists(bp) else {}
    for k, v in o.items():
        if k in t:
            rows.setdefault(k, []).append((v, t[k], b.get(k)))
print("| workload | scenario | batch | after per round | before per round | PyTorch per round | after / PyTorch per round | median | before / PyTorch median | after / before median |")
print("|---|---|---:|---|---|---|---|---:|---:|---:|")
for k in sorted(rows):
    v = rows[k]
    r = [a / t for a, t, _ in v]
    bs = [b for _, _, b in v if b]
    br = [b / t for _, t, b in v if b]
    ab = [a / b for a, _, b in v if b]
    f = lambda xs: ", ".join(f"{x:,.1f}" for x in xs)
    med = lambda xs, s="x": f"{statistics.median(xs):.2f}{s}" if xs else "-"
    print(f"| {k[0]} | {k[1]} | {k[2]} | {f(a for a,_,_ in v)} | {f(bs) or '-'} | {f(t for _,t,_ in v)} | {', '.join(f'{x:.2f}x' for x in r)} | **{med(r)}** | {med(br)} | {med(ab)} |")
PY
tar czf $OUT/rounds.tgz -C /tmp rounds
cp $W/medians.md $W/host.txt $W/profile-after.log $OUT/
