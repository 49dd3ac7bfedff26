#!/usr/bin/env bash
# cpu-s7.sh: issue 24's bf16 on the GPU machine's host CPU (AMX, AVX512_BF16): the kernel
# tests on the paths that host has, MiniLM bf16 accuracy per path, then streampool f32 and
# bf16 against PyTorch CPU eager f32 and bf16 (oneDNN) in the same call.
#
# Carry (relative to the repo the device tool sends): D=.dev-cpu with streampool.xz (release
# CLI), streampool-lib-tests.xz (the streampool crate's test binary), cpu_compare.py,
# torch_baseline.py, minilm_reference.json, this script; and .dev/minilm-fp16.
# Usage there: bash .dev-cpu/cpu-s7.sh   (writes under $OUT)
set -uo pipefail
OUT=${OUT:-/tmp/out}
D=${D:-.dev-cpu}
M=${M:-.dev/minilm-fp16}
SECS=${SECS:-2}
mkdir -p "$OUT/ours" "$OUT/torch"
for f in streampool streampool-lib-tests; do
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open('$D/$f.xz'), open('/tmp/$f','wb'))"
  chmod +x /tmp/$f
done
{
  lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|Socket"
  echo "flags: $(grep -o 'amx[a-z0-9_]*\|avx512_bf16\|avx512_fp16' /proc/cpuinfo | sort -u | tr '\n' ' ')"
  python3 -c "import torch; print('torch', torch.__version__, 'threads', torch.get_num_threads(), 'cpu capability', torch.backends.cpu.get_cpu_capability(), 'mkldnn', torch.backends.mkldnn.is_available())" 2>&1 | tail -1
} > "$OUT/host.txt" 2>&1
cat "$OUT/host.txt"

# 1. Kernel tests: every bf16 path the host has against f64 (AMX and AVX512_BF16 here).
/tmp/streampool-lib-tests cpu::kernels::bf16 --nocapture > "$OUT/tests.log" 2>&1
echo "kernel tests rc=$?"; grep -E "test |result" "$OUT/tests.log"

# 2. MiniLM accuracy per path: the reference sentences, bf16 on each path and f32.
python3 - "$D/minilm_reference.json" > /tmp/texts.txt <<'PY'
import json, sys
for s in json.load(open(sys.argv[1]))["sentences"]:
    print(s["text"])
PY
mapfile -t TEXTS < /tmp/texts.txt
/tmp/streampool embed --model "$M" --dtype f32 --json "${TEXTS[@]}" > "$OUT/emb-f32.json" 2>/dev/null
for p in amx avx512 portable; do
  STREAMPOOL_CPU_BF16=$p /tmp/streampool embed --model "$M" --dtype bf16 --json "${TEXTS[@]}" > "$OUT/emb-bf16-$p.json" 2>"$OUT/emb-$p.err"
done
python3 - "$D/minilm_reference.json" "$OUT" > "$OUT/accuracy.txt" <<'PY'
import json, sys, math
ref = [s["embedding_fp16_weights"] for s in json.load(open(sys.argv[1]))["sentences"]]
def cos(a, b):
    return sum(x * y for x, y in zip(a, b)) / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
for name in ["f32", "bf16-amx", "bf16-avx512", "bf16-portable"]:
    try:
        e = [x["embedding"] for x in json.load(open(f"{sys.argv[2]}/emb-{name}.json"))["embeddings"]]
        f = [x["embedding"] for x in json.load(open(f"{sys.argv[2]}/emb-f32.json"))["embeddings"]]
        print(f"{name}: min cosine to sentence-transformers fp32 {min(cos(a, b) for a, b in zip(e, ref)):.8f}, "
              f"to our f32 {min(cos(a, b) for a, b in zip(e, f)):.8f} ({len(e)} sentences)")
    except Exception as err:
        print(f"{name}: {err!r}")
PY
cat "$OUT/accuracy.txt"; cat "$OUT"/emb-*.err | grep -i -E "warn|error" | head -5

# 3. Speed: ours f32 and bf16 (the host's best path), the bf16 paths forced, PyTorch f32/bf16.
B="--device cpu --workloads minilm32,minilm128 --forward-batches 1,64 --seconds $SECS --minilm $M"
/tmp/streampool bench $B --scenarios forward,ceiling --ceiling-batches 64 --dtypes f32,bf16 \
  --out "$OUT/ours" > "$OUT/ours.log" 2>&1
echo "ours rc=$?"
for p in avx512 portable; do
  mkdir -p "$OUT/ours-$p"
  STREAMPOOL_CPU_BF16=$p /tmp/streampool bench $B --scenarios forward --dtypes bf16 \
    --out "$OUT/ours-$p" > "$OUT/ours-$p.log" 2>&1
  echo "ours bf16 $p rc=$?"
done
STREAMPOOL_CPU_PROFILE=1 /tmp/streampool bench --device cpu --workloads minilm32,minilm128 --forward-batches 1,64 \
  --seconds 1 --minilm "$M" --scenarios forward --dtypes bf16 --out /tmp/prof > "$OUT/profile-bf16.log" 2>&1
python3 "$D/torch_baseline.py" --device cpu --workloads minilm32,minilm128 --dtypes f32,bf16 --dtype-only \
  --forward-batches 1,64 --seconds "$SECS" --minilm "$M" --out "$OUT/torch" > "$OUT/torch.log" 2>&1
echo "torch rc=$?"
python3 "$D/cpu_compare.py" "$OUT/ours/streampool.json" "$OUT/torch/pytorch.json" > "$OUT/cpu-compare.md" 2>&1
for p in avx512 portable; do
  python3 - "$OUT/ours-$p/streampool.json" "$p" >> "$OUT/cpu-compare.md" <<'PY'
import json, sys
for r in json.load(open(sys.argv[1]))["results"]:
    print(f"- bf16 forced {sys.argv[2]}: {r['workload']} batch {r['batch']}: {r['throughput_per_s']:.1f}/s")
PY
done
(cd "$OUT" && tar czf all.tgz ours ours-avx512 ours-portable torch *.log emb-*.json 2>/dev/null; rm -rf ours ours-avx512 ours-portable torch *.log emb-*)
cat "$OUT/cpu-compare.md"
