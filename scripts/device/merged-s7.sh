#!/usr/bin/env bash
# merged-s7.sh: session 7's merged main on the H100, one call: the CUDA suites, then the
# served path (scripts/device/served-s5.sh: the server under loadgen's many clients, text in,
# vectors out) with the merged binary.
# Carry [".dev"] with .dev/streampool.xz (cargo build --release -p streampool-cli --features
# cuda, stripped), .dev/tests/*.xz (stripped CUDA test binaries; nn-* run from
# crates/streampool-nn) and .dev/minilm-fp16.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
unxz_to() { python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$1" "$2"; chmod +x "$2"; }
mkdir -p .dev/bin
unxz_to .dev/streampool.xz .dev/streampool
for f in .dev/tests/*.xz; do unxz_to "$f" ".dev/bin/$(basename "$f" .xz)"; done
export STREAMPOOL_MINILM_DIR=$PWD/.dev/minilm-fp16
mkdir -p "$OUT/tests"
for t in .dev/bin/*; do
  name=$(basename "$t")
  case $name in nn-*) dir=crates/streampool-nn;; *) dir=crates/streampool;; esac
  (cd $dir && timeout 300 ../../$t --test-threads 4 > "$OUT/tests/$name.log" 2>&1)
  echo "$name rc=$? $(grep -E '^test result' "$OUT/tests/$name.log" | tail -1)" | tee -a "$OUT/tests/summary.txt"
done
tar czf "$OUT/tests.tgz" -C "$OUT" tests && rm -rf "$OUT/tests"
B=.dev/streampool DURATION=${DURATION:-5} WARMUP=${WARMUP:-1} bash scripts/device/served-s5.sh
