#!/usr/bin/env bash
# ThreadSanitizer over the concurrency tests (streampool's core suites, the batch queue and
# the server), on the stable toolchain.
#
# Usage: scripts/tsan.sh [extra cargo test args]
#        scripts/tsan.sh --stress N [BINARY...] [-- TEST_ARGS...]
# The first form writes the full log to $CARGO_TARGET_DIR/tsan.log (target/tsan unless set)
# and exits non-zero if TSan reported anything. The second runs scripts/stress.sh with the
# TSan build instead: N runs of each binary, a TSan report fails its run (exit code 66).
#
# How: RUSTC_BOOTSTRAP=1 unlocks -Zsanitizer on stable; `--target <host>` keeps build scripts
# and proc macros uninstrumented (they run on the host). There is no rust-src here, so the
# standard library itself is not instrumented: TSan cannot see the happens-before edges of
# std's own locks/channels/Once, which is why the runtime synchronizes with parking_lot and
# crossbeam (compiled from source, hence instrumented). Suppressions, if any, live in
# scripts/tsan.supp, each with the reason.
set -euo pipefail
cd "$(dirname "$0")/.."
host=$(rustc -vV | sed -n 's/^host: //p')
export RUSTC_BOOTSTRAP=1
export RUSTFLAGS="-Zsanitizer=thread -Cunsafe-allow-abi-mismatch=sanitizer"
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-target/tsan}
# allocator_may_return_null: allocator.rs's `a_request_the_backend_refuses_fails_instead_of_retrying`
# asks the CPU backend for 4 TiB on purpose, to get a refusal; TSan's allocator otherwise
# aborts the test binary on it instead of returning null as the system allocator does.
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 allocator_may_return_null=1 suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
mkdir -p "$CARGO_TARGET_DIR"
if [[ ${1:-} == --stress ]]; then
    shift
    # stress.sh builds with plain `cargo test`; this makes it build for the host target too.
    export CARGO_BUILD_TARGET=$host
    exec scripts/stress.sh "$@"
fi
log="$CARGO_TARGET_DIR/tsan.log"
# package: its test binaries. One cargo call per package (each names only its own tests);
# a failing package does not stop the others.
suites=(
    "streampool: --test concurrency --test allocator --test lazy_events --test smoke --test intra_op"
    "streampool-batch: --test batch_queue"
    "streampool-serve: --test server --test overload"
)
: >"$log"
status=0
for suite in "${suites[@]}"; do
    pkg=${suite%%:*}
    read -ra tests <<<"${suite#*:}"
    echo "building and running $pkg ${tests[*]} under ThreadSanitizer (log: $log)" >&2
    set +e
    cargo test --release --target "$host" -p "$pkg" "${tests[@]}" "$@" 2>&1 | tee -a "$log"
    rc=${PIPESTATUS[0]}
    set -e
    [ "$rc" -eq 0 ] || status=$rc
done
reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
echo "ThreadSanitizer reports: $reports (cargo test exit status $status)"
[ "$status" -eq 0 ] && [ "$reports" -eq 0 ]
