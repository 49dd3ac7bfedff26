// p: [out offset, len, value bits]
@group(0) @binding(1) var<storage, read_write> out: array<T>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(1u)) {
        return;
    }
    out[prm(0u) + i] = T(prmf(2u));
}
