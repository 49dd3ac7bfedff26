// p: [qkv offset, mask offset, has mask, out offset, batch, seq, heads, head_dim]
// qkv: [batch, seq, 3, heads, head_dim] (queries pre-scaled), mask: f32 [batch, seq] of 0/1,
// out: [batch, seq, heads * head_dim]. Without a mask, `mask` is bound to any f32 buffer and
// not read. head_dim a multiple of 4 and at most 64 (checked by the launcher; other widths
// take `attention.wgsl`).
//
// One 256-wide workgroup per (sequence, head, block of 32 queries). The block's queries are
// staged once in workgroup memory; the keys are walked in tiles of 32, each tile's K and V
// rows staged in workgroup memory (f32, rows padded by one vec4 so the vec4 reads below hit
// distinct banks) in chunks of four columns, at most two per invocation (32 rows x 16 vec4s);
// the next tile's chunks are loaded into registers while the current tile is computed
// (session 9). Invocation (q, lane), q = index / 8, lane = index % 8, scores keys lane,
// lane + 8, lane + 16, lane + 24 of the tile for query q into `ps` (each query vec4 read once
// for the four keys); then every invocation of
// query q folds the tile's 32 scores into the online softmax (running max and sum in f32,
// the output rescaled when the max grows) and accumulates its own output columns: vec4
// groups lane and lane + 8 (columns 4 lane.. and 32 + 4 lane..). A padded key scores
// f32::MIN (Hugging Face's additive mask): it adds nothing unless every key is padding, and
// then the row attends uniformly.
@group(0) @binding(1) var<storage, read> qkv: array<T>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

const BQ: u32 = 32u;
const BKEY: u32 = 32u;
// Row pitch in vec4s: 64 columns plus one vec4 of padding.
const P4: u32 = 17u;
// Pitch of the score rows: 32 plus one (conflict-free reads by four queries at once).
const PS: u32 = 33u;

var<workgroup> qs: array<vec4<f32>, 544>; // BQ * P4
var<workgroup> ks: array<vec4<f32>, 544>; // BKEY * P4
var<workgroup> vs: array<vec4<f32>, 544>;
var<workgroup> ps: array<f32, 1056>; // BQ * PS

// Four consecutive elements of `qkv` from `at`, widened.
fn load4(at: u32) -> vec4<f32> {
    return vec4<f32>(f32(qkv[at]), f32(qkv[at + 1u]), f32(qkv[at + 2u]), f32(qkv[at + 3u]));
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let g = group_index(wid, nwg);
    let seq = prm(5u);
    let heads = prm(6u);
    let d = prm(7u);
    let qblocks = (seq + BQ - 1u) / BQ;
    // Uniform across the workgroup: the whole workgroup leaves, or none of it.
    if (g >= prm(4u) * heads * qblocks) {
        return;
    }
    let qb = g % qblocks;
    let h = (g / qblocks) % heads;
    let b = g / (qblocks * heads);
    let hidden = heads * d;
    let width = 3u * hidden;
    let base = prm(0u) + b * seq * width + h * d;
    let q_first = qb * BQ;
    let q = li / 8u;
    let lane = li % 8u;
    let has_mask = prm(2u) != 0u;
    let padded = bitcast<f32>(0xff7fffffu); // f32::MIN

    // The block's queries (zero past the sequence's end).
    for (var e = li; e < BQ * d; e += 256u) {
        let r = e / d;
        let c = e % d;
        var v = 0.0;
        if (q_first + r < seq) {
            v = f32(qkv[base + (q_first + r) * width + c]);
        }
        qs[r * P4 + c / 4u][c % 4u] = v;
    }

    var run_max = neg_inf();
    var run_sum = 0.0;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    let d4 = d / 4u;
    // This invocation's K/V chunks of a tile: vec4 chunks li and li + 256 of the tile's
    // nk * d4 (at most 32 * 16 = 512), row r, columns 4 c..; the same in every tile.
    let r0 = li / d4;
    let c0 = li % d4;
    let r1 = (li + 256u) / d4;
    let c1 = (li + 256u) % d4;
    // The first tile's chunks.
    var pk0 = vec4<f32>(0.0);
    var pv0 = vec4<f32>(0.0);
    var pk1 = vec4<f32>(0.0);
    var pv1 = vec4<f32>(0.0);
    let nk_first = min(BKEY, seq);
    if (r0 < nk_first) {
        let at = base + r0 * width + hidden + 4u * c0;
        pk0 = load4(at);
        pv0 = load4(at + hidden);
    }
    if (r1 < nk_first) {
        let at = base + r1 * width + hidden + 4u * c1;
        pk1 = load4(at);
        pv1 = load4(at + hidden);
    }
    for (var j0 = 0u; j0 < seq; j0 += BKEY) {
        let nk = min(BKEY, seq - j0);
        // K and V rows of the tile, from the registers.
        if (r0 < nk) {
            ks[r0 * P4 + c0] = pk0;
            vs[r0 * P4 + c0] = pv0;
        }
        if (r1 < nk) {
            ks[r1 * P4 + c1] = pk1;
            vs[r1 * P4 + c1] = pv1;
        }
        workgroupBarrier();
        // The next tile's chunks, loaded while this one is computed.
        let jn = j0 + BKEY;
        if (jn < seq) {
            let nkn = min(BKEY, seq - jn);
            if (r0 < nkn) {
                let at = base + (jn + r0) * width + hidden + 4u * c0;
                pk0 = load4(at);
                pv0 = load4(at + hidden);
            }
            if (r1 < nkn) {
                let at = base + (jn + r1) * width + hidden + 4u * c1;
                pk1 = load4(at);
                pv1 = load4(at + hidden);
            }
        }
        // Scores of query q against keys lane + 8 i (rows past nk hold stale values: their
        // dot products are computed and discarded).
        var dot0 = vec4<f32>(0.0);
        var dot1 = vec4<f32>(0.0);
        var dot2 = vec4<f32>(0.0);
        var dot3 = vec4<f32>(0.0);
        for (var c = 0u; c < d4; c++) {
            let qv = qs[q * P4 + c];
            dot0 = fma(qv, ks[lane * P4 + c], dot0);
            dot1 = fma(qv, ks[(lane + 8u) * P4 + c], dot1);
            dot2 = fma(qv, ks[(lane + 16u) * P4 + c], dot2);
            dot3 = fma(qv, ks[(lane + 24u) * P4 + c], dot3);
        }
        let dots = array<vec4<f32>, 4>(dot0, dot1, dot2, dot3);
        for (var i = 0u; i < 4u; i++) {
            let j = lane + 8u * i;
            var s = neg_inf();
            if (j < nk) {
                if (has_mask && mask[prm(1u) + b * seq + j0 + j] == 0.0) {
                    s = padded;
                } else {
                    let dt = dots[i];
                    s = dt.x + dt.y + dt.z + dt.w;
                }
            }
            ps[q * PS + j] = s;
        }
        workgroupBarrier();
        // Online softmax over the tile (key 0 is always in it, so the max is finite and the
        // first rescale multiplies by exp(-inf) = 0).
        // Both loops run over the whole tile, a constant trip count the driver can unroll,
        // in two independent chains (even and odd keys) instead of one dependent chain: keys
        // past `nk` scored -inf and weigh exp(-inf) = 0 (their `vs` rows hold finite values
        // of an earlier tile, or the zeros workgroup memory starts with).
        var m0 = neg_inf();
        var m1 = neg_inf();
        for (var j = 0u; j < BKEY; j += 2u) {
            m0 = max(m0, ps[q * PS + j]);
            m1 = max(m1, ps[q * PS + j + 1u]);
        }
        let new_max = max(run_max, max(m0, m1));
        let scale = exp(run_max - new_max);
        var sum0 = 0.0;
        var sum1 = 0.0;
        var a0 = acc0 * scale;
        var a1 = acc1 * scale;
        var b0 = vec4<f32>(0.0);
        var b1 = vec4<f32>(0.0);
        for (var j = 0u; j < BKEY; j += 2u) {
            let p0 = exp(ps[q * PS + j] - new_max);
            let p1 = exp(ps[q * PS + j + 1u] - new_max);
            sum0 += p0;
            sum1 += p1;
            a0 = fma(vec4<f32>(p0), vs[j * P4 + lane], a0);
            b0 = fma(vec4<f32>(p1), vs[(j + 1u) * P4 + lane], b0);
            if (d > 32u) {
                a1 = fma(vec4<f32>(p0), vs[j * P4 + lane + 8u], a1);
                b1 = fma(vec4<f32>(p1), vs[(j + 1u) * P4 + lane + 8u], b1);
            }
        }
        acc0 = a0 + b0;
        acc1 = a1 + b1;
        run_sum = run_sum * scale + sum0 + sum1;
        run_max = new_max;
        // `ks`, `vs` and `ps` are overwritten by the next tile.
        workgroupBarrier();
    }
    let token = q_first + q;
    if (token < seq) {
        let o = prm(3u) + (b * seq + token) * hidden + h * d;
        let inv = 1.0 / run_sum;
        for (var c = 0u; c < 4u; c++) {
            let c0 = lane * 4u + c;
            if (c0 < d) {
                out[o + c0] = T(acc0[c] * inv);
            }
            let c1 = 32u + lane * 4u + c;
            if (c1 < d) {
                out[o + c1] = T(acc1[c] * inv);
            }
        }
    }
}
