#!/usr/bin/env bash
# ThreadSanitizer over streampool's concurrency tests, on the stable toolchain.
#
# Usage: scripts/tsan.sh [extra cargo test args]
# Writes the full log to target/tsan/tsan.log and exits non-zero if TSan reported anything.
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
export TSAN_OPTIONS="halt_on_error=0 report_signal_unsafe=0 suppressions=$PWD/scripts/tsan.supp ${TSAN_OPTIONS:-}"
mkdir -p "$CARGO_TARGET_DIR"
log="$CARGO_TARGET_DIR/tsan.log"
tests=(--test concurrency --test allocator --test lazy_events --test smoke)
echo "building and running ${tests[*]} under ThreadSanitizer (log: $log)" >&2
set +e
cargo test --release --target "$host" -p streampool "${tests[@]}" "$@" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
reports=$(grep -c "WARNING: ThreadSanitizer" "$log" || true)
echo "ThreadSanitizer reports: $reports (cargo test exit status $status)"
[ "$status" -eq 0 ] && [ "$reports" -eq 0 ]
