#!/usr/bin/env bash
# Per-op host cost in instructions (repeatable on a noisy machine): runs the host_cost
# example's `perop` chain under callgrind at two lengths and divides the difference in
# instructions (only the queuing thread, only inside `queue_chain`) by the extra ops queued,
# which cancels the warm-up and setup. Usage: scripts/callgrind-host-cost.sh BINARY [ROWS]
# (BINARY: a release build of `--example host_cost`; ROWS default "auto lazy pwide").
set -euo pipefail
bin=$(realpath "$1")
rows=${2:-auto lazy pwide}
out=$(mktemp -d)
for row in $rows; do
    declare -A ir=() launch=()
    for n in 10000 20000; do
        HOST_COST_EVENTS=$row HOST_COST_OPS=$n valgrind --tool=callgrind \
            --toggle-collect='*queue_chain*' --callgrind-out-file="$out/cg.$row.$n" \
            "$bin" perop >/dev/null 2>"$out/log.$row.$n"
        ir[$n]=$(grep -oP 'Collected : \K[0-9]+' "$out/log.$row.$n")
        # The backend's launch (inclusive): on the CPU a job queue whose worker wake-ups
        # depend on scheduling, so it is reported apart from the runtime's own path.
        launch[$n]=$(callgrind_annotate --inclusive=yes "$out/cg.$row.$n" 2>/dev/null |
            awk '/BackendStream>::launch \[/ && !f { gsub(",", "", $1); print $1; f = 1 }')
    done
    # Five timed chains per run: 5 x 10000 more ops in the longer run.
    total=$(( (ir[20000] - ir[10000]) / 50000 ))
    backend=$(( (launch[20000] - launch[10000]) / 50000 ))
    echo "$row $total instructions/op, of which backend launch $backend, runtime $((total - backend))"
done
echo "callgrind files in $out"
