// p: [m, n, k, first batch, a offset, a batch stride, a row stride, a col stride,
//     b offset, b batch stride, b row stride, b col stride, out offset, and the epilogue's
//     bias offset, activation, has bias (`epilogue.wgsl`)]
// out[b] = a[b] @ b[b], 16x16 output tiles per workgroup; the K dimension is walked in
// 16-wide tiles staged in workgroup memory. Each tile's products are summed apart and then
// added to the accumulator, which keeps long K sums accurate.
@group(0) @binding(1) var<storage, read> a: array<T>;
@group(0) @binding(2) var<storage, read> b: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

var<workgroup> ta: array<array<f32, 16>, 16>;
var<workgroup> tb: array<array<f32, 16>, 16>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let m = prm(0u);
    let n = prm(1u);
    let k = prm(2u);
    let bi = wid.z + prm(3u);
    let row = wid.y * 16u + lid.y;
    let col = wid.x * 16u + lid.x;
    let abase = prm(4u) + bi * prm(5u);
    let bbase = prm(8u) + bi * prm(9u);
    var acc = 0.0;
    let tiles = (k + 15u) / 16u;
    for (var t = 0u; t < tiles; t++) {
        let ka = t * 16u + lid.x;
        var va = 0.0;
        if (row < m && ka < k) {
            va = f32(a[abase + row * prm(6u) + ka * prm(7u)]);
        }
        ta[lid.y][lid.x] = va;
        let kb = t * 16u + lid.y;
        var vb = 0.0;
        if (kb < k && col < n) {
            vb = f32(b[bbase + kb * prm(10u) + col * prm(11u)]);
        }
        tb[lid.y][lid.x] = vb;
        workgroupBarrier();
        var part = 0.0;
        for (var i = 0u; i < 16u; i++) {
            part += ta[lid.y][i] * tb[i][lid.x];
        }
        acc += part;
        workgroupBarrier();
    }
    if (row < m && col < n) {
        out[prm(12u) + bi * m * n + row * n + col] = T(epi(acc, col));
    }
}
