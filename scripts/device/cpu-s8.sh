#!/usr/bin/env bash
# cpu-s8.sh: issue 24, session 8 (prepacked weights, our f32 microkernels) on the GPU
# machine's host CPU: the CPU kernel tests (AVX-512 f32 kernels, AMX and AVX512_BF16),
# MiniLM accuracy, then main's binary (before) and this branch's (after), f32 and bf16, and
# PyTorch CPU eager f32/bf16 with sentence-transformers, in one call.
#
# Carry (relative to the repo the device tool sends): D=.dev-s8-cpu with streampool-before.xz
# (main's release CLI at 6442474), streampool.xz (this branch's), streampool-lib-tests.xz (the
# streampool crate's release test binary), cpu_compare.py, torch_baseline.py,
# minilm_reference.json, this script; and .dev/minilm-fp16.
# Usage there: bash .dev-s8-cpu/cpu-s8.sh   (writes under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}
D=${D:-.dev-s8-cpu}
M=${M:-.dev/minilm-fp16}
SECS=${SECS:-2}
mkdir -p "$OUT"
for f in streampool streampool-before streampool-lib-tests; do
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open('$D/$f.xz'), open('/tmp/$f','wb'))"
  chmod +x /tmp/$f
done
{
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket|L1d|L2|L3"
  echo "flags: $(grep -o 'amx[a-z0-9_]*\|avx512_bf16\|avx512_fp16\|avx512f' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads(), 'cpu capability', torch.backends.cpu.get_cpu_capability())" 2>&1 | tail -1
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"

# 1. CPU kernel tests: the f32 microkernels and every bf16 path this host has, against f64.
/tmp/streampool-lib-tests cpu::kernels --test-threads 4 > "$OUT/tests.log" 2>&1
echo "kernel tests rc=$?"; grep -E "sgemm|bf16|result" "$OUT/tests.log" | grep -E "test |result"

# 2. MiniLM accuracy: the reference sentences, f32 and bf16 (AMX), against sentence-transformers.
python3 - "$D/minilm_reference.json" > /tmp/texts.txt <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["sentences"]:
    print(s["text"])
PY
mapfile -t TEXTS < /tmp/texts.txt
for dt in f32 bf16; do
  /tmp/streampool embed --model "$M" --dtype $dt --json "${TEXTS[@]}" > "/tmp/emb-$dt.json" 2>/dev/null
done
python3 - "$D/minilm_reference.json" > "$OUT/accuracy.txt" <<'PY'
import json, sys, math
ref = [s["embedding_fp16_weights"] for s in json.load(open(sys.argv[1]))["sentences"]]
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
for name in ["f32", "bf16"]:
    e = [x["embedding"] for x in json.load(open(f"/tmp/emb-{name}.json"))["embeddings"]]
    print(f"{name}: min cosine to sentence-transformers fp32 {min(cos(a, b) for a, b in zip(e, ref)):.8f} ({len(e)} sentences)")
PY
cat "$OUT/accuracy.txt"

# 3. Speed, before and after back to back, then PyTorch; the same points on each side.
B="--device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS --minilm $M"
for side in before after; do
  bin=/tmp/streampool; [ $side = before ] && bin=/tmp/streampool-before
  mkdir -p "/tmp/ours-$side"
  $bin bench $B --scenarios forward,ceiling --ceiling-batches 64 --dtypes f32,bf16 \
    --out "/tmp/ours-$side" > "$OUT/ours-$side.log" 2>&1
  echo "ours $side rc=$?"
  cp "/tmp/ours-$side/streampool.json" "$OUT/ours-$side.json"
done
python3 "$D/torch_baseline.py" --device cpu --workloads minilm32,minilm128 --dtypes f32,bf16 --dtype-only \
  --forward-batches 1,64 --seconds "$SECS" --minilm "$M" --out /tmp/torch > "$OUT/torch.log" 2>&1
echo "torch rc=$?"
cp /tmp/torch/pytorch.json "$OUT/torch.json"
# 4. Where the time goes now (f32 and bf16, per kernel and shape), and the row-block knob.
STREAMPOOL_CPU_PROFILE=1 /tmp/streampool bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 \
  --seconds 1 --minilm "$M" --scenarios forward --dtypes f32,bf16 --out /tmp/prof > "$OUT/profile-after.log" 2>&1
for kib in 128 512; do
  STREAMPOOL_CPU_SGEMM_BLOCK_KIB=$kib /tmp/streampool bench --device cpu --workloads minilm32 --forward-batches 64 \
    --seconds 1 --minilm "$M" --scenarios forward --dtypes f32 --out /tmp/kib$kib 2>&1 | grep -E "forward .*batch 64" | sed "s/^/block $kib KiB: /" >> "$OUT/block-kib.log"
done
cat "$OUT/block-kib.log"
for side in before after; do
  echo "## $side"
  python3 "$D/cpu_compare.py" "$OUT/ours-$side.json" "$OUT/torch.json"
done > "$OUT/cpu-compare.md" 2>&1
# At most 8 files come back: the JSONs and full logs go in one archive.
(cd "$OUT" && tar czf all.tgz ours-*.json ours-*.log torch.json torch.log && rm -f ours-*.json ours-*.log torch.json torch.log)
grep -E "^  minilm|^ +[0-9.]+%" "$OUT/profile-after.log" | grep -E "minilm|matmul|attention|layer_norm" | head -60
cat "$OUT/cpu-compare.md"
