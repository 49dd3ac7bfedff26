#!/usr/bin/env bash
# Issue #11 on a CUDA machine: per-op host cost and the eager MLP threading after the
# allocator was sharded per stream. Build first (one line, on the machine or with the tree):
#   cargo build --release -p streampool-cli --features cuda &&
#   cargo build --release -p streampool --features cuda,wgpu --example cuda_profile --example host_cost
# then: scripts/device/alloc-host-cost.sh [OUT_DIR]   (default $OUT, else bench/results/h100-alloc)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-${OUT:-bench/results/h100-alloc}}
mkdir -p "$out"
bin=${CARGO_TARGET_DIR:-target}/release
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$out/gpu.txt" || true
# The bench's overhead point (per-op host cost, the README's 3.96 us) and the eager MLP at
# 1..64 threads (the README's 50,090 .. 185,187 calls/s).
"$bin/streampool" bench --device cuda --workloads mlp --scenarios threading,overhead \
    --threads 1,2,4,8,16,32,64 --out "$out" 2>&1 | tee "$out/bench.log"
# Ops that allocate and free at 1..64 threads (the README's 661k/s at 8, 116k/s at 64), and
# the per-op chain, on the process-wide device (pwide) and on a device of its own.
HOST_COST_DEVICE=cuda "$bin/examples/host_cost" 2>&1 | tee "$out/host_cost.log"
# Where an eager MLP call's host time goes, at 1..64 threads.
PROFILE_MODES=eager "$bin/examples/cuda_profile" units phases 2>&1 | tee "$out/cuda_profile.log"
