// p: [m, n, k, first batch, a offset, a batch stride, a row stride, a col stride,
//     b offset, b batch stride, b row stride, b col stride, out offset]
// out[b] = a[b] @ b[b] on matrix units, through wgpu's cooperative matrices
// (`EXPERIMENTAL_COOPERATIVE_MATRIX`): f16 operands, 16x16x16 products accumulated in f32.
// Only launched where the adapter lists that configuration, has `SUBGROUP` with 32-wide
// subgroups (so the 128 invocations are exactly 4 subgroups), and the setting opts in.
//
// A workgroup computes a 64x64 block of the output; subgroup s its 32x32 quadrant
// (rows 32 (s / 2).., columns 32 (s % 2)..) as four 16x16 f32 accumulators. The K dimension
// is walked in 32-wide slices: the A slice (64 x 32) and the B slice (32 x 64) are staged
// row-major in workgroup memory as f16 (zero outside the matrix, so partial blocks need no
// other care), and each subgroup loads its 16x16 operands from there. The accumulators go
// out through workgroup memory, each invocation storing in-range elements.
@group(0) @binding(1) var<storage, read> a: array<T>;
@group(0) @binding(2) var<storage, read> b: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

const BK: u32 = 32u;
var<workgroup> sa: array<f16, 2048>; // 64 x BK
var<workgroup> sb: array<f16, 2048>; // BK x 64
var<workgroup> sc: array<f32, 4096>; // 4 subgroups x 32 x 32

@compute @workgroup_size(128)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32,
        @builtin(subgroup_id) sg: u32) {
    let m = prm(0u);
    let n = prm(1u);
    let k = prm(2u);
    let bi = wid.z + prm(3u);
    let row0 = wid.y * 64u;
    let col0 = wid.x * 64u;
    let abase = prm(4u) + bi * prm(5u);
    let ars = prm(6u);
    let acs = prm(7u);
    let bbase = prm(8u) + bi * prm(9u);
    let brs = prm(10u);
    let bcs = prm(11u);
    let a_along_k = acs == 1u;
    let b_along_k = brs == 1u && bcs != 1u;
    let qr = (sg / 2u) * 32u;
    let qc = (sg % 2u) * 32u;
    var c00 = coop_mat16x16<f32, C>();
    var c01 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>();
    var c11 = coop_mat16x16<f32, C>();
    let slices = (k + BK - 1u) / BK;
    for (var t = 0u; t < slices; t++) {
        let k0 = t * BK;
        // 2048 elements of each slice, 16 per invocation, walking whichever dimension is
        // adjacent in memory.
        for (var r = 0u; r < 16u; r++) {
            let e = r * 128u + li;
            var mi = e % 64u;
            var ki = e / 64u;
            if (a_along_k) {
                mi = e / BK;
                ki = e % BK;
            }
            var v = f16(0.0);
            if (row0 + mi < m && k0 + ki < k) {
                v = a[abase + (row0 + mi) * ars + (k0 + ki) * acs];
            }
            sa[mi * BK + ki] = v;
            var ni = e % 64u;
            var kj = e / 64u;
            if (b_along_k) {
                ni = e / BK;
                kj = e % BK;
            }
            var w = f16(0.0);
            if (col0 + ni < n && k0 + kj < k) {
                w = b[bbase + (k0 + kj) * brs + (col0 + ni) * bcs];
            }
            sb[kj * 64u + ni] = w;
        }
        workgroupBarrier();
        for (var kk = 0u; kk < BK; kk += 16u) {
            let a0 = coopLoadT<coop_mat16x16<f16, A>>(&sa[qr * BK + kk], BK);
            let a1 = coopLoadT<coop_mat16x16<f16, A>>(&sa[(qr + 16u) * BK + kk], BK);
            let b0 = coopLoadT<coop_mat16x16<f16, B>>(&sb[kk * 64u + qc], 64u);
            let b1 = coopLoadT<coop_mat16x16<f16, B>>(&sb[kk * 64u + qc + 16u], 64u);
            c00 = coopMultiplyAdd(a0, b0, c00);
            c01 = coopMultiplyAdd(a0, b1, c01);
            c10 = coopMultiplyAdd(a1, b0, c10);
            c11 = coopMultiplyAdd(a1, b1, c11);
        }
        workgroupBarrier();
    }
    let q = sg * 1024u;
    coopStoreT(c00, &sc[q], 32u);
    coopStoreT(c01, &sc[q + 16u], 32u);
    coopStoreT(c10, &sc[q + 512u], 32u);
    coopStoreT(c11, &sc[q + 528u], 32u);
    workgroupBarrier();
    let obase = prm(12u) + bi * m * n;
    for (var r = 0u; r < 32u; r++) {
        let e = r * 128u + li;
        let s = e / 1024u;
        let rr = (s / 2u) * 32u + (e % 1024u) / 32u;
        let cc = (s % 2u) * 32u + e % 32u;
        if (row0 + rr < m && col0 + cc < n) {
            out[obase + (row0 + rr) * n + col0 + cc] = T(sc[e]);
        }
    }
}
