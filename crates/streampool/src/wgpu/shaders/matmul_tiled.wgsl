// p: [m, n, k, first batch, a offset, a batch stride, a row stride, a col stride,
//     b offset, b batch stride, b row stride, b col stride, out offset]
// out[b] = a[b] @ b[b], register-blocked: a 16x16 workgroup computes a (16 TM) x (16 TN)
// output tile, each invocation TM x TN outputs (`TM`, `TN` are declared by the launcher in
// front of this body: 4x4 gives 64x64 tiles, 2x2 32x32). The K dimension is walked in
// 16-wide slices staged in workgroup memory as f32 (half inputs are widened on load).
//
// Loads are coalesced for either operand layout: an operand whose elements are adjacent
// along K (a row-major A, the transposed weight view `W^T` as B) is read with consecutive
// invocations walking K, otherwise with them walking M (or N). The staged slices are padded
// by one column so those stores, and the reads of the product loop, are free of workgroup
// memory bank conflicts. An invocation's outputs are 16 rows and 16 columns apart, so
// neighbouring invocations write neighbouring columns.
//
// Each slice's products are summed apart and then added to the accumulators, which keeps
// long K sums as accurate as the 16x16 kernel's.
@group(0) @binding(1) var<storage, read> a: array<T>;
@group(0) @binding(2) var<storage, read> b: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

const BK: u32 = 16u;
const BM: u32 = 16u * TM;
const BN: u32 = 16u * TN;
// Row pitch of the staged slices: one more than the tile width (see above).
const PA: u32 = BM + 1u;
const PB: u32 = BN + 1u;

var<workgroup> sa: array<f32, 16u * (16u * TM + 1u)>;
var<workgroup> sb: array<f32, 16u * (16u * TN + 1u)>;

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let m = prm(0u);
    let n = prm(1u);
    let k = prm(2u);
    let bi = wid.z + prm(3u);
    let row0 = wid.y * BM;
    let col0 = wid.x * BN;
    let abase = prm(4u) + bi * prm(5u);
    let ars = prm(6u);
    let acs = prm(7u);
    let bbase = prm(8u) + bi * prm(9u);
    let brs = prm(10u);
    let bcs = prm(11u);
    let a_along_k = acs == 1u;
    let b_along_k = brs == 1u && bcs != 1u;
    var acc: array<array<f32, TN>, TM>;
    let slices = (k + BK - 1u) / BK;
    for (var t = 0u; t < slices; t++) {
        let k0 = t * BK;
        // The A slice: BM x BK elements, TM per invocation.
        for (var r = 0u; r < TM; r++) {
            let e = r * 256u + li;
            var mi = e % BM;
            var ki = e / BM;
            if (a_along_k) {
                mi = e / BK;
                ki = e % BK;
            }
            let gm = row0 + mi;
            let gk = k0 + ki;
            var v = 0.0;
            if (gm < m && gk < k) {
                v = f32(a[abase + gm * ars + gk * acs]);
            }
            sa[ki * PA + mi] = v;
        }
        // The B slice: BK x BN elements, TN per invocation.
        for (var r = 0u; r < TN; r++) {
            let e = r * 256u + li;
            var ni = e % BN;
            var ki = e / BN;
            if (b_along_k) {
                ni = e / BK;
                ki = e % BK;
            }
            let gn = col0 + ni;
            let gk = k0 + ki;
            var v = 0.0;
            if (gn < n && gk < k) {
                v = f32(b[bbase + gk * brs + gn * bcs]);
            }
            sb[ki * PB + ni] = v;
        }
        workgroupBarrier();
        var part: array<array<f32, TN>, TM>;
        for (var kk = 0u; kk < BK; kk++) {
            var av: array<f32, TM>;
            for (var i = 0u; i < TM; i++) {
                av[i] = sa[kk * PA + lid.y + 16u * i];
            }
            for (var j = 0u; j < TN; j++) {
                let bv = sb[kk * PB + lid.x + 16u * j];
                for (var i = 0u; i < TM; i++) {
                    part[i][j] = fma(av[i], bv, part[i][j]);
                }
            }
        }
        for (var i = 0u; i < TM; i++) {
            for (var j = 0u; j < TN; j++) {
                acc[i][j] += part[i][j];
            }
        }
        workgroupBarrier();
    }
    let obase = prm(12u) + bi * m * n;
    for (var i = 0u; i < TM; i++) {
        let r = row0 + lid.y + 16u * i;
        if (r < m) {
            for (var j = 0u; j < TN; j++) {
                let c = col0 + lid.x + 16u * j;
                if (c < n) {
                    out[obase + r * n + c] = T(acc[i][j]);
                }
            }
        }
    }
}
