#!/usr/bin/env bash
# Runs the concurrency-heavy test modules N times each (release, or STRESS_PROFILE=dev), with
# the default test parallelism, and reports how often every test failed: timing-dependent
# failures (a lost wake-up, a block reused too early) rarely show in one `cargo test` run.
#
# Usage: scripts/stress.sh [N] [MODULE...] [-- TEST_ARGS...]
#   N          runs of each module (default 20)
#   MODULE     test modules to run, by name (default: all of them, see `suites` below)
#   TEST_ARGS  passed to every run instead of the module's test list: name tests by their
#              path in the crate's test binary, e.g. `allocator::NAME --exact`
# Example: scripts/stress.sh 200 allocator -- allocator::concurrent_requests_at_the_limit --exact
#
# Each crate has one integration-test binary (`tests/it/main.rs`), a module per area; a run of
# a module runs exactly that module's top-level tests (so `concurrency` does not take the
# copy of the suite that `wgpu::concurrency` runs on another backend). The binaries are built
# once (`cargo test --no-run`) and then run directly, from their package's directory as
# `cargo test` would, so N runs cost N runs and not N cargo calls. Each run has a time limit
# (STRESS_TIMEOUT seconds, default 600): a hang counts as a failure. Logs of failed runs are
# kept under $CARGO_TARGET_DIR/stress/. Exits non-zero if any run failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

n=20
if [[ $# -gt 0 && $1 =~ ^[0-9]+$ ]]; then
    n=$1
    shift
fi
only=()
while [[ $# -gt 0 && $1 != -- ]]; do
    only+=("$1")
    shift
done
[[ ${1:-} == -- ]] && shift
test_args=("$@")

# package:module of its `it` test binary, every suite whose tests race threads against each
# other.
suites=(
    streampool:concurrency
    streampool:allocator
    streampool:lazy_events
    streampool-batch:batch_queue
    streampool-batch:pipeline
    streampool-serve:server
    streampool-serve:overload
)
if [[ ${#only[@]} -gt 0 ]]; then
    picked=()
    for want in "${only[@]}"; do
        found=
        for s in "${suites[@]}"; do
            [[ ${s#*:} == "$want" ]] && picked+=("$s") && found=1
        done
        [[ -n $found ]] || { echo "stress.sh: unknown test module '$want'" >&2; exit 2; }
    done
    suites=("${picked[@]}")
fi

export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$root/target}
out="$CARGO_TARGET_DIR/stress"
rm -rf "$out"
mkdir -p "$out"

# Build once; cargo reports each test executable in its JSON messages. STRESS_PROFILE=dev
# takes the binaries of `cargo test --workspace --tests` (test profile, opt-level 2: the same
# build as CI's tests, so nothing is compiled again after it); the default is a release
# build of each suite.
pick='
import json, sys
def package(pid):
    # "path+file:///dir/NAME#VERSION" or "path+file:///dir/DIR#NAME@VERSION"
    path, _, frag = pid.partition("#")
    return frag.split("@")[0] if "@" in frag else path.rstrip("/").rsplit("/", 1)[-1]
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") \
            and m["target"]["name"] == sys.argv[1] and "test" in m["target"]["kind"] \
            and package(m["package_id"]) == sys.argv[2]:
        print(m["executable"])
'
if [[ ${STRESS_PROFILE:-release} == dev ]]; then
    workspace_json=$(cargo test --workspace --tests --no-run --message-format=json)
fi
declare -A exe pkgdir selection
for s in "${suites[@]}"; do
    pkg=${s%%:*} module=${s#*:}
    if [[ ${STRESS_PROFILE:-release} == dev ]]; then
        path=$(python3 -c "$pick" it "$pkg" <<<"$workspace_json")
    else
        path=$(cargo test --release -p "$pkg" --test it --no-run --message-format=json \
            | python3 -c "$pick" it "$pkg")
    fi
    [[ -n $path ]] || { echo "stress.sh: no executable for $s" >&2; exit 2; }
    exe[$s]=$path
    pkgdir[$s]=$root/crates/$pkg
    # The module's own tests, by exact name: libtest's filters match substrings, so a plain
    # `concurrency::` would also pick `wgpu::concurrency::*`.
    names=$(cd "${pkgdir[$s]}" && "$path" --list --format terse \
        | sed -nE "s/^(${module}::[^ ]+): test$/\1/p")
    [[ -n $names ]] || { echo "stress.sh: no tests in module $s" >&2; exit 2; }
    selection[$s]=$names
done

tally="$out/tally.tsv" # binary, test, ok|FAILED, one line per test per run
: >"$tally"
failed_runs=0
start=$(date +%s)
echo "stress: ${#suites[@]} modules x $n runs (${test_args[*]:-all their tests})" >&2
for ((i = 1; i <= n; i++)); do
    for s in "${suites[@]}"; do
        bin=${s#*:}
        log="$out/run.log"
        if [[ ${#test_args[@]} -gt 0 ]]; then
            args=("${test_args[@]}")
        else
            mapfile -t args <<<"${selection[$s]}"
            args+=(--exact)
        fi
        set +e
        (cd "${pkgdir[$s]}" && CARGO_MANIFEST_DIR="${pkgdir[$s]}" \
            timeout "${STRESS_TIMEOUT:-600}" "${exe[$s]}" "${args[@]}") >"$log" 2>&1
        rc=$?
        set -e
        sed -nE "s/^test (.+) \.\.\. (ok|FAILED)$/$bin\t\1\t\2/p" "$log" >>"$tally"
        if [[ $rc -ne 0 ]]; then
            failed_runs=$((failed_runs + 1))
            cp "$log" "$out/$bin-run$i.log"
            # A crash or hang names no failed test: count it against the binary.
            if ! grep -qE '^test .+ \.\.\. FAILED$' "$log"; then
                printf '%s\t(binary exit %s)\tFAILED\n' "$bin" "$rc" >>"$tally"
            fi
            echo "run $i: $bin failed (exit $rc), log: $out/$bin-run$i.log" >&2
        fi
    done
    ((i % 10 == 0)) && echo "stress: $i/$n runs done, $failed_runs failed" >&2
done
secs=$(($(date +%s) - start))

echo
echo "| module | test | runs | failures |"
echo "|---|---|---:|---:|"
awk -F'\t' '{ k = $1 "\t" $2; runs[k]++; if ($3 == "FAILED") bad[k]++ }
    END { for (k in runs) { split(k, p, "\t"); printf "| %s | %s | %d | %d |\n", p[1], p[2], runs[k], bad[k] } }' \
    "$tally" | sort
echo
echo "stress: ${#suites[@]} modules x $n runs in ${secs} s; $failed_runs failed runs"
[[ $failed_runs -eq 0 ]]
