#!/usr/bin/env bash
# Issue #11, per-op host cost on a CUDA machine: our per-op path (`host_cost perop`: chain and
# bursts, heap allocations per op) next to the driver's floor on the same GPU (`host_cost
# driver`: raw cuLaunchKernel / cuEventRecord / cuCtxGetCurrent through cudarc), and the bench's
# overhead point. Build first (on the machine or with the tree):
#   cargo build --release -p streampool --features cuda --example host_cost &&
#   cargo build --release -p streampool-cli --features cuda
# then: scripts/device/host-cost-session4.sh [OUT_DIR]   (default $OUT, else bench/results/h100-hostcost)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-bench/results/h100-hostcost}}
mkdir -p "$out"
bin=${CARGO_TARGET_DIR:-target}/release
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt" || true
# Per-op chain (all three rows), then the driver floor, twice each: the first pass also
# warms the driver's and the GPU's clocks.
for pass in 1 2; do
    echo "== pass $pass" | tee -a "$out/host_cost.log"
    HOST_COST_DEVICE=cuda "$bin/examples/host_cost" perop driver 2>&1 | tee -a "$out/host_cost.log"
done
# Ops that allocate and free at 1..64 threads (the allocator-sharding table's figures).
HOST_COST_DEVICE=cuda "$bin/examples/host_cost" threads 2>&1 | tee "$out/host_cost_threads.log"
# The bench's overhead point (the README's 5.04 us), if the CLI was built.
if [ -x "$bin/streampool" ]; then
    "$bin/streampool" bench --device cuda --workloads mlp --scenarios overhead --out "$out" \
        2>&1 | tee "$out/bench.log"
fi
