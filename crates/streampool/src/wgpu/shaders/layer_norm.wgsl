// p: [x offset, residual offset, has residual, gamma offset, beta offset, out offset, rows,
//     cols, eps bits]. Without a residual, `res` is bound to x's buffer and not read.
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read> res: array<T>;
@group(0) @binding(3) var<storage, read> gamma: array<T>;
@group(0) @binding(4) var<storage, read> beta: array<T>;
@group(0) @binding(5) var<storage, read_write> out: array<T>;

fn value(row: u32, c: u32) -> f32 {
    let i = row * prm(7u) + c;
    var v = f32(x[prm(0u) + i]);
    if (prm(2u) != 0u) {
        v += f32(res[prm(1u) + i]);
    }
    return v;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if (row >= prm(6u)) {
        return;
    }
    let cols = prm(7u);
    var s = 0.0;
    for (var c = lid; c < cols; c += 256u) {
        s += value(row, c);
    }
    let mean = tree_sum(lid, s) / f32(cols);
    var q = 0.0;
    for (var c = lid; c < cols; c += 256u) {
        let d = value(row, c) - mean;
        q += d * d;
    }
    let inv = 1.0 / sqrt(tree_sum(lid, q) / f32(cols) + prmf(8u));
    let ob = prm(5u) + row * cols;
    for (var c = lid; c < cols; c += 256u) {
        out[ob + c] = T((value(row, c) - mean) * inv * f32(gamma[prm(3u) + c]) + f32(beta[prm(4u) + c]));
    }
}
