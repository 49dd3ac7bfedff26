// p: [op (0 sum, 1 mean, 2 max), x offset, out offset, outer, axis, inner]
// One workgroup per output element of [outer, inner]; the axis is split over 256 invocations.
@group(0) @binding(1) var<storage, read> x: array<T>;
@group(0) @binding(2) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let o = group_index(wid, nwg);
    let inner = prm(5u);
    if (o >= prm(3u) * inner) {
        return;
    }
    let axis = prm(4u);
    let base = prm(1u) + (o / inner) * axis * inner + o % inner;
    let op = prm(0u);
    var y: f32;
    if (op == 2u) {
        var m = neg_inf();
        for (var a = lid; a < axis; a += 256u) {
            m = max(m, f32(x[base + a * inner]));
        }
        y = tree_max(lid, m);
    } else {
        // Kahan summation per invocation, then the tree.
        var s = 0.0;
        var comp = 0.0;
        for (var a = lid; a < axis; a += 256u) {
            let t = f32(x[base + a * inner]) - comp;
            let n = s + t;
            comp = (n - s) - t;
            s = n;
        }
        y = tree_sum(lid, s);
        if (op == 1u) {
            y = y / f32(axis);
        }
    }
    if (lid == 0u) {
        out[prm(2u) + o] = T(y);
    }
}
