// p: [x offset, out offset, len]. `S` and `D` (the source and destination element types,
// f32 or f16) are declared by the launcher in front of this body. WGSL converts f32 to f16
// to a nearest value (round to nearest even on IEEE hardware); a value beyond f16's range has
// no defined result in WGSL (the drivers measured give infinity, as the CPU backend does).
@group(0) @binding(1) var<storage, read> x: array<S>;
@group(0) @binding(2) var<storage, read_write> out: array<D>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    if (i >= prm(2u)) {
        return;
    }
    out[prm(1u) + i] = D(x[prm(0u) + i]);
}
