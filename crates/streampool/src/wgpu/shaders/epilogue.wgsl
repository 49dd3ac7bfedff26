// The matmul kernels' epilogue (after `prelude.wgsl`): p[13] bias offset, p[14] activation
// (0 identity, 1 relu, 2 gelu, 3 tanh gelu), p[15] whether a bias is bound at binding 4
// (without one, a read-only operand is bound there and not read). Fusing the bias and
// activation into the product's stores saves the separate bias pass of every linear layer.
@group(0) @binding(4) var<storage, read> bias: array<T>;

fn act_(v: f32) -> f32 {
    let act = prm(14u);
    if (act == 1u) {
        return max(v, 0.0);
    }
    if (act == 2u) {
        return gelu(v);
    }
    if (act == 3u) {
        return gelu_tanh(v);
    }
    return v;
}

// The output value at column `c` (c < n).
fn epi(v: f32, c: u32) -> f32 {
    var y = v;
    if (prm(15u) != 0u) {
        y += f32(bias[prm(13u) + c]);
    }
    return act_(y);
}

// Four outputs at columns c..c+3, all < n.
fn epi4(v: vec4<f32>, c: u32) -> vec4<f32> {
    return vec4<f32>(epi(v.x, c), epi(v.y, c + 1u), epi(v.z, c + 2u), epi(v.w, c + 3u));
}
