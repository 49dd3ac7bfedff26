// p: as `matmul.wgsl` (m is 1): [m, n, k, first batch, a offset, a batch stride, a row
//     stride, a col stride, b offset, b batch stride, b row stride, b col stride, out offset,
//     and the epilogue's bias offset, activation, has bias, lanes per column]
// out[b] = a[b] @ b[b] for a single row (batch-1 layers): the tiled kernels give one row
// of a 16-row tile to every workgroup, so most of each workgroup idles and the weight is
// read by few workgroups (a 1x256 @ 256x1024 layer took 29 us on the H100). Here a
// 256-wide workgroup computes 256 / L columns with L invocations per column (L = 32, 64,
// 128 or 256, chosen at launch so that narrow outputs still make enough workgroups):
// invocation `l` of column `j` sums k = l, l + L, ... (coalesced when the weight is stored
// along K, as the models' `W^T` is), then the L partial sums are added in workgroup memory.
@group(0) @binding(1) var<storage, read> a: array<T>;
@group(0) @binding(2) var<storage, read> b: array<T>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) li: u32) {
    let n = prm(1u);
    let k = prm(2u);
    let bi = wid.z + prm(3u);
    let lanes = prm(16u);
    let lane = li % lanes;
    let col = wid.x * (256u / lanes) + li / lanes;
    let abase = prm(4u) + bi * prm(5u);
    let acs = prm(7u);
    let bbase = prm(8u) + bi * prm(9u) + col * prm(11u);
    let brs = prm(10u);
    var sum = 0.0;
    if (col < n) {
        for (var kk = lane; kk < k; kk += lanes) {
            sum = fma(f32(a[abase + kk * acs]), f32(b[bbase + kk * brs]), sum);
        }
    }
    part[li] = sum;
    workgroupBarrier();
    for (var s = lanes / 2u; s > 0u; s = s / 2u) {
        if (lane < s) {
            part[li] += part[li + s];
        }
        workgroupBarrier();
    }
    if (lane == 0u && col < n) {
        out[prm(12u) + bi * n + col] = T(epi(part[li], col));
    }
}
