// p: [x offset, out offset, rows, cols]
// The exponentials are computed again in the last pass rather than stored and re-read, so a
// half output is rounded once.
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= prm(2u)) {
        return;
    }
    let cols = prm(3u);
    let xb = prm(0u) + row * cols;
    let ob = prm(1u) + row * cols;
    var m = neg_inf();
    for (var c = lid; c < cols; c += 256u) {
        m = max(m, f32(x[xb + c]));
    }
    let mx = tree_max(lid, m);
    var s = 0.0;
    for (var c = lid; c < cols; c += 256u) {
        s += exp(f32(x[xb + c]) - mx);
    }
    let inv = 1.0 / tree_sum(lid, s);
    for (var c = lid; c < cols; c += 256u) {
        out[ob + c] = T(exp(f32(x[xb + c]) - mx) * inv);
    }
}
