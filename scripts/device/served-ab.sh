#!/usr/bin/env bash
# served-ab.sh: the served path, an older CLI ("old") against the merged main ("new"),
# interleaved in one call (session 8: 6442474 vs its merge; session 9: 8b6eb79 vs its merge): `streampool serve --device cuda` (f16, defaults) on 12 cores,
# `streampool loadgen` on 4, rounds of {old, new} x {256 clients x one 128-token sentence,
# 64 clients x 32 short sentences with base64 answers, 1 client one short sentence}.
# Two calls back to back on a warm machine (the carry limit holds one CLI beside the model):
#   1. carry [OLD]: OLD=<folder> STAGE=keep bash scripts/device/served-ab.sh  (unpacks OLD/streampool.xz,
#      the old CLI, to /tmp/keep; OLD defaults to .dev-s8-old)
#   2. carry [".dev"]: bash scripts/device/served-ab.sh  (the new CLI from .dev/streampool.xz)
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
if [ "${STAGE:-}" = keep ]; then
  mkdir -p /tmp/keep && unxz_to ${OLD:-.dev-s8-old}/streampool.xz /tmp/keep/old && ls -l /tmp/keep; exit 0
fi
[ -x /tmp/keep/old ] || { echo "no /tmp/keep/old: the first call's machine was not kept"; exit 1; }
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
mkdir -p /tmp/keep && unxz_to .dev/streampool.xz /tmp/keep/new
M=.dev/minilm-fp16; PORT=18091; W=/tmp/ab; rm -rf $W; mkdir -p $W
for round in 1 2 3; do
  for v in old new; do
    B=/tmp/keep/$v
    taskset -c 0-11 $B serve --device cuda --model $M --port $PORT > $W/server-$v-$round.log 2>&1 &
    srv=$!
    taskset -c 12-15 $B loadgen --url http://127.0.0.1:$PORT --wait-ready 120 --requests 1 --warmup 0 > /dev/null
    for run in "long -c 256 -k 1 --corpus long" "b64 -c 64 -k 32 --corpus short --encoding base64" "lat -c 1 -k 1 --corpus short"; do
      set -- $run; name=$1; shift
      taskset -c 12-15 $B loadgen --url http://127.0.0.1:$PORT --server-pid $srv --tokenizer $M/tokenizer.json \
        --warmup 1 --duration 5 --json $W/$name-$v-$round.json "$@" > $W/$name-$v-$round.log 2>&1
    done
    kill -TERM $srv; wait $srv 2>/dev/null
  done
done
python3 - $W <<'PY' | tee $OUT/served-ab.md
import json, sys, glob, statistics
w = sys.argv[1]
print("| point | build | sentences/s (rounds 1-3) | median | p50 ms (median) | lg cpu |")
print("|---|---|---|---:|---:|---:|")
for name in ["long", "b64", "lat"]:
    for v in ["old", "new"]:
        tp, p50, lg = [], [], []
        for r in (1, 2, 3):
            try:
                p = json.load(open(f"{w}/{name}-{v}-{r}.json"))["points"][-1]
            except Exception as e:
                continue
            tp.append(p["sentences_per_s"])
            p50.append(p["latency_ms"]["p50"])
            lg.append(p["loadgen_cpu"]["cores"])
        if tp:
            print(f"| {name} | {v} | {', '.join(f'{x:,.0f}' for x in tp)} | {statistics.median(tp):,.0f} | {statistics.median(p50):.3f} | {statistics.median(lg):.2f} |")
PY
tar czf $OUT/served-ab.tgz -C /tmp ab
