// p: [op, len, rank, a offset, b offset, out offset, shape[rank], a strides[rank], b strides[rank]]
// op: 0 add, 1 sub, 2 mul, 3 div, 4 max. Broadcast dimensions have stride 0.
@group(0) @binding(1) var<storage, read> a: array<T>;
@group(0) @binding(2) var<storage, read> b: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(1u)) {
        return;
    }
    let rank = prm(2u);
    var rem = i;
    var ia = prm(3u);
    var ib = prm(4u);
    for (var k = 0u; k < rank; k++) {
        let d = rank - 1u - k;
        let n = prm(6u + d);
        let idx = rem % n;
        rem = rem / n;
        ia += idx * prm(6u + rank + d);
        ib += idx * prm(6u + 2u * rank + d);
    }
    let u = f32(a[ia]);
    let v = f32(b[ib]);
    var y: f32;
    switch prm(0u) {
        case 0u: { y = u + v; }
        case 1u: { y = u - v; }
        case 2u: { y = u * v; }
        case 3u: { y = u / v; }
        default: { y = max(u, v); }
    }
    out[prm(5u) + i] = T(y);
}
