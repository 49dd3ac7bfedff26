// p: [op, x offset, out offset, len, mul bits, add bits]
// op: 0 relu, 1 gelu, 2 tanh, 3 exp, 4 sqrt, 5 sqr, 6 neg, 7 recip, 8 affine
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(3u)) {
        return;
    }
    let v = f32(x[prm(1u) + i]);
    var y: f32;
    switch prm(0u) {
        case 0u: { y = max(v, 0.0); }
        case 1u: { y = gelu(v); }
        case 2u: { y = tanh_(v); }
        case 3u: { y = exp(v); }
        case 4u: { y = sqrt(v); }
        case 5u: { y = v * v; }
        case 6u: { y = -v; }
        case 7u: { y = 1.0 / v; }
        default: { y = v * prmf(4u) + prmf(5u); }
    }
    out[prm(2u) + i] = T(y);
}
