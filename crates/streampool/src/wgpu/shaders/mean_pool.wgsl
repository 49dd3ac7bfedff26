// p: [x offset, mask offset, out offset, batch, seq, dim]
// x: [batch, seq, dim] of T, mask: f32 [batch, seq], out: f32 [batch, dim]. One workgroup
// per sentence: the masked mean (token count floored at 1e-9), then divided by its L2 norm
// (floored at 1e-12), as sentence-transformers' mean pooling and `normalize`.
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let b = group_index(wid, nwg);
    if (b >= prm(3u)) {
        return;
    }
    let seq = prm(4u);
    let dim = prm(5u);
    let mb = prm(1u) + b * seq;
    var c = 0.0;
    for (var s = lid; s < seq; s += 256u) {
        c += mask[mb + s];
    }
    let count = max(tree_sum(lid, c), 1e-9);
    let xb = prm(0u) + b * seq * dim;
    let ob = prm(2u) + b * dim;
    var sq = 0.0;
    for (var col = lid; col < dim; col += 256u) {
        var acc = 0.0;
        for (var s = 0u; s < seq; s++) {
            let w = mask[mb + s];
            if (w != 0.0) {
                acc += w * f32(x[xb + s * dim + col]);
            }
        }
        let mean = acc / count;
        out[ob + col] = mean;
        sq += mean * mean;
    }
    let inv = 1.0 / max(sqrt(tree_sum(lid, sq)), 1e-12);
    // Each invocation rescales the columns it wrote itself.
    for (var col = lid; col < dim; col += 256u) {
        out[ob + col] = out[ob + col] * inv;
    }
}
