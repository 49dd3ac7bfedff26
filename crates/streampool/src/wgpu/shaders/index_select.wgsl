// p: [table offset, ids offset (32-bit words), out offset, n_ids * row_len, row_len, table_rows]
// ids are i64, read as (low, high) word pairs; ids outside 0..table_rows give zero rows.
@group(0) @binding(1) var<storage, read> table: array<T>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(3u)) {
        return;
    }
    let row_len = prm(4u);
    let r = i / row_len;
    let c = i % row_len;
    let lo = ids[prm(1u) + 2u * r];
    let hi = ids[prm(1u) + 2u * r + 1u];
    var y = T(0.0);
    if (hi == 0u && lo < prm(5u)) {
        y = table[prm(0u) + lo * row_len + c];
    }
    out[prm(2u) + i] = y;
}
