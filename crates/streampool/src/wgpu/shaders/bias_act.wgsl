// p: [x offset, bias offset, out offset, rows * cols, cols, act (0 identity, 1 relu, 2 gelu, 3 tanh gelu)]
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read> bias: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(3u)) {
        return;
    }
    let v = f32(x[prm(0u) + i]) + f32(bias[prm(1u) + i % prm(4u)]);
    var y = v;
    let act = prm(5u);
    if (act == 1u) {
        y = max(v, 0.0);
    } else if (act == 2u) {
        y = gelu(v);
    } else if (act == 3u) {
        y = gelu_tanh(v);
    }
    out[prm(2u) + i] = T(y);
}
