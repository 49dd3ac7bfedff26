#!/usr/bin/env bash
# cpu-s9-tests.sh: this branch's CPU kernel tests on the 16-core host (release builds, so the
# AVX-512 sgemm and attention paths and the AMX / AVX512_BF16 bf16 paths run against f64):
# the library's `cpu::` unit tests and tests/dtypes.rs.
# Carry [".dev-s9-cpu-tests"] (lib-tests.xz, dtypes-tests.xz: `cargo test --release -p
# streampool --lib --no-run` and `--test dtypes --no-run`, stripped; this script).
# Usage there: bash .dev-s9-cpu-tests/cpu-s9-tests.sh
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
D=.dev-s9-cpu-tests; B=/tmp/s9t; mkdir -p $B
for f in lib-tests dtypes-tests; do
  python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" $D/$f.xz $B/$f
  chmod +x $B/$f
done
{ lscpu | grep -E "Model name|^CPU\(s\)"; grep -o -w -E "avx512f|avx512_bf16|amx_bf16|amx_tile" /proc/cpuinfo | sort -u | tr '\n' ' '; echo; } > $OUT/tests.log
{ $B/lib-tests cpu:: 2>&1; $B/dtypes-tests 2>&1; } >> $OUT/tests.log
grep -E "^test |test result|FAILED|panicked" $OUT/tests.log
