//! Every WGSL kernel of the wgpu backend, as the backend builds it (each in f32 and f16
//! storage, the blocked matmul in every tile and layout, and the cooperative-matrix matmul
//! in every tile and layout, both on matrix units, which no CI adapter has, and emulated),
//! parsed and validated by naga and translated to SPIR-V
//! (Vulkan) and MSL (Metal), without a GPU. A kernel that fails here would fail to build on
//! a device of that platform.

use naga::back::{msl, spv};
use naga::valid::{Capabilities, ValidationFlags, Validator};

#[test]
fn every_kernel_translates_to_spirv_and_msl() {
    let sources = streampool::wgpu_kernel_sources();
    // 16 kernels in one or two storage types plus 48 blocked variants in two.
    assert!(sources.len() > 100, "{} kernels", sources.len());
    let (mut coop, mut emulated) = (0, 0);
    for (label, source) in &sources {
        if label.starts_with("matmul coop") && label.contains("emulated") {
            emulated += 1;
        }
        let module = naga::front::wgsl::parse_str(source)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
        let caps = if source.contains("enable wgpu_cooperative_matrix;") {
            coop += 1;
            Capabilities::SHADER_FLOAT16 | Capabilities::COOPERATIVE_MATRIX | Capabilities::SUBGROUP
        } else if source.starts_with("enable f16;") {
            Capabilities::SHADER_FLOAT16
        } else {
            Capabilities::empty()
        };
        let info = Validator::new(ValidationFlags::all(), caps)
            .validate(&module)
            .unwrap_or_else(|e| panic!("{label}: {}", e.emit_to_string(source)));
        let words = spv::write_vec(&module, &info, &spv::Options::default(), None)
            .unwrap_or_else(|e| panic!("{label} to SPIR-V: {e}"));
        assert!(words.len() > 5, "{label}: empty SPIR-V");
        // Metal 2.3: where Apple's simdgroup matrices (the cooperative matrices there) begin.
        let options = msl::Options {
            lang_version: (2, 3),
            ..msl::Options::default()
        };
        let pipeline = msl::PipelineOptions {
            entry_point: Some((naga::ShaderStage::Compute, "main".to_string())),
            ..msl::PipelineOptions::default()
        };
        let (text, _) = msl::write_string(&module, &info, &options, &pipeline)
            .unwrap_or_else(|e| panic!("{label} to MSL: {e}"));
        assert!(text.contains("kernel"), "{label}: no kernel in the MSL");
    }
    // 4 block tiles x 2 slice depths x 3 layouts, on matrix units and emulated.
    assert_eq!(coop, 24, "cooperative-matrix matmuls on matrix units");
    assert_eq!(emulated, 24, "emulated cooperative-matrix matmuls");
}
