#!/usr/bin/env bash
# merged-s6.sh: the CUDA suites on session 6's merged main (#20 packed + epilogue, #23
# families, #24 CPU kernels). Carry .dev/tests/*.xz (stripped test binaries).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
SP=/opt/torch/.venv/lib/python3.12/site-packages
export LD_LIBRARY_PATH=$SP/nvidia/cu13/lib:/usr/local/cuda/targets/x86_64-linux/lib:${LD_LIBRARY_PATH:-}
mkdir -p .dev/bin
for f in .dev/tests/*.xz; do
  b=.dev/bin/$(basename "$f" .xz)
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "$f" "$b"
  chmod +x "$b"
done
[ -d .dev/minilm-fp16 ] && export STREAMPOOL_MINILM_DIR=$PWD/.dev/minilm-fp16
for t in .dev/bin/*; do
  name=$(basename "$t")
  # Test binaries run from their crate's folder (they find models/ and tests/data there).
  case $name in nn-*) dir=crates/streampool-nn;; *) dir=crates/streampool;; esac
  (cd $dir && timeout 300 ../../$t --test-threads 4 > "$OUT/$name.log" 2>&1)
  echo "$name rc=$? $(grep -E '^test result' "$OUT/$name.log" | tail -1)"
done
tar czf "$OUT/logs.tgz" -C "$OUT" $(cd "$OUT" && ls *.log) && rm -f "$OUT"/*.log
