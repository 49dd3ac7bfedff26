// Prepended to every kernel: the launch parameters and helpers.
//
// Every kernel binds whole buffers and gets element offsets into them in `p` (a pointer of
// the wgpu backend is a buffer plus a byte offset), so views and reused allocator blocks need
// no rebinding at another offset. A uniform buffer (not storage) keeps loop bounds uniform
// for the barriers of the row and tile kernels.
@group(0) @binding(0) var<uniform> p: array<vec4<u32>, 16>;

fn prm(i: u32) -> u32 {
    return p[i / 4u][i % 4u];
}

fn prmf(i: u32) -> f32 {
    return bitcast<f32>(prm(i));
}

// Index of an invocation of a 256-wide workgroup on a 2-D grid (the grid is 2-D because one
// dimension holds at most 65,535 workgroups).
fn linear(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * 256u + lid;
}

fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// -inf. Built from a parameter word that is always zero (the launcher never fills word 63)
// because a constant expression may not evaluate to an infinity in WGSL.
fn neg_inf() -> f32 {
    return bitcast<f32>(0xff800000u | prm(63u));
}

// erf by Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7); WGSL has no erf.
fn erf_(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t + 0.254829592) * t;
    let y = 1.0 - poly * exp(-x * x);
    return select(y, -y, x < 0.0);
}

// GELU, erf form (as BERT uses it).
fn gelu(x: f32) -> f32 {
    return 0.5 * x * (1.0 + erf_(x * 0.70710678118654752));
}

// tanh from exp of a non-positive argument: no overflow, exact +-1 for large |x|, NaN kept
// (drivers may lower the builtin to a coarse approximation).
fn tanh_(x: f32) -> f32 {
    let e = exp(-2.0 * abs(x));
    let t = (1.0 - e) / (1.0 + e);
    return select(t, -t, x < 0.0);
}

// GELU, tanh approximation (Hugging Face's gelu_new; cuBLASLt's GELU epilogue).
fn gelu_tanh(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tanh_(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
