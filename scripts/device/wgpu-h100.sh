#!/usr/bin/env bash
# The wgpu measurements of issue #12 on a GPU machine through its Vulkan driver (the lent
# H100: NVIDIA's Vulkan ICD). Writes everything under ${OUT:-out}/wgpu/.
#
#   bash scripts/device/wgpu-h100.sh
#
# 1. the wgpu op/dtype/concurrency/allocator suite (F16 runs where the adapter has SHADER_F16),
# 2. the model checks on wgpu: tiny-bert f32/tf32/f16, MiniLM f32 and f16 vs sentence-transformers,
# 3. examples/wgpu_bench: concurrent host encoding (1-16 threads, quarantine off/on) and
#    matmul per kernel (16x16 before, 32x32 and 64x64 register-blocked, auto),
# 4. `streampool bench --device wgpu` in f16 and f32 (minilm workloads), quick.
set -euo pipefail
out="${OUT:-out}/wgpu"
mkdir -p "$out"
cargo build --release -p streampool --features wgpu --example wgpu_bench
cargo build --release -p streampool-cli
vulkaninfo --summary > "$out/vulkaninfo.txt" 2>&1 || true
cargo test --release -p streampool --features wgpu --test wgpu -- --nocapture 2>&1 | tee "$out/wgpu-tests.log" | tail -3
cargo test --release -p streampool-nn --features wgpu --test wgpu -- --nocapture 2>&1 | tee "$out/nn-wgpu.log" | tail -3
./target/release/examples/wgpu_bench encode --ops 5000 2>&1 | tee "$out/encode.md"
./target/release/examples/wgpu_bench matmul --secs 0.5 2>&1 | tee "$out/matmul.md"
for dt in f16 f32; do
  ./target/release/streampool bench --device wgpu --quick --dtype "$dt" \
    --workloads minilm32,minilm128 --scenarios ceiling 2>&1 | tee "$out/bench-wgpu-$dt.log" | tail -5
done
./target/release/streampool embed --device wgpu --dtype f16 --minilm "a sentence on the GPU in f16" \
  2>&1 | tee "$out/embed-f16.log" | head -3
