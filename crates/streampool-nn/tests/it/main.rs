//! The integration tests of `streampool-nn`: one test binary (each binary links the whole
//! dependency tree, which dominates a 2-core CI's build), a module per area, and `util` for
//! the reference files and closeness measures they share. Reference data lives in
//! `tests/data/`.
//!
//! The backend suites build with their feature: `cuda` needs a GPU at run time (and returns
//! early without one), `wgpu` runs on any Vulkan/Metal/DX12 adapter (Mesa's lavapipe in CI).

mod buckets;
mod chunking;
mod concurrency;
#[cfg(feature = "cuda")]
mod cuda;
mod errors;
mod families;
mod half;
mod layers;
mod minilm;
mod packed;
mod real_models;
mod tiny_bert;
mod tokenize;
mod util;
#[cfg(feature = "wgpu")]
mod wgpu;
