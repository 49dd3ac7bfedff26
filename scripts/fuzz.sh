#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for N seconds each (default 60), on the stable
# toolchain.
#
# Usage: scripts/fuzz.sh [seconds] [target...]
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). Exits non-zero at the first target
# that crashes; the crashing input is left in fuzz/artifacts/<target>/ and can be replayed
# with `RUSTC_BOOTSTRAP=1 cargo fuzz run <target> fuzz/artifacts/<target>/<file>`.
#
# How: RUSTC_BOOTSTRAP=1 unlocks the -Zsanitizer/-Zextra flags cargo-fuzz passes (it expects
# nightly). The standard library is not rebuilt with AddressSanitizer (no rust-src here), so
# `-Cunsafe-allow-abi-mismatch=sanitizer` acknowledges the uninstrumented std, as in
# scripts/tsan.sh. Each target's working corpus is fuzz/corpus/<target> (ignored by git);
# the committed seeds in fuzz/seeds/<target> are read as a second, read-only corpus.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(safetensors_load config_load tensor_ops serve_request kserve_decode embeddings_input)
fi
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="${RUSTFLAGS:-} -Cunsafe-allow-abi-mismatch=sanitizer"
for t in "${targets[@]}"; do
    corpus="fuzz/corpus/$t"
    mkdir -p "$corpus"
    seeds=()
    [ -d "fuzz/seeds/$t" ] && seeds=("fuzz/seeds/$t")
    echo "== $t: ${secs}s" >&2
    # -malloc_limit_mb: a single allocation over 512 MiB is a finding (a size the client
    # declared, allocated before it was checked, would otherwise pass wherever it fits).
    cargo fuzz run "$t" "$corpus" "${seeds[@]}" -- -max_total_time="$secs" -print_final_stats=1 \
        -malloc_limit_mb=512 -rss_limit_mb=4096
done
