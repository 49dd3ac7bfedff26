// p: [qkv offset, mask offset, has mask, out offset, batch, seq, heads, head_dim]
// qkv: [batch, seq, 3, heads, head_dim] (queries pre-scaled), mask: f32 [batch, seq] of 0/1,
// out: [batch, seq, heads * head_dim]. Without a mask, `mask` is bound to any f32 buffer and
// not read.
//
// One 256-wide workgroup per (token, head): the keys are walked in chunks of 256, one key
// per invocation, with an online softmax (running max and sum in f32, the output rescaled
// when the max grows), so any sequence length works and no score matrix is stored. The
// first head_dim invocations (head_dim <= 256, checked by the launcher) each own one output
// element. A padded key scores f32::MIN (Hugging Face's additive mask): it adds nothing
// unless every key is padding, and then the row attends uniformly.
@group(0) @binding(1) var<storage, read> qkv: array<T>;
@group(0) @binding(2) var<storage, read> mask: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<T>;

var<workgroup> probs: array<f32, 256>;

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let seq = prm(5u);
    let heads = prm(6u);
    let d = prm(7u);
    if (g >= prm(4u) * seq * heads) {
        return;
    }
    let h = g % heads;
    let token = g / heads;
    let b = token / seq;
    let hidden = heads * d;
    let width = 3u * hidden;
    let q = prm(0u) + token * width + h * d;
    let k0 = prm(0u) + b * seq * width + hidden + h * d;
    let v0 = k0 + hidden;
    let padded = bitcast<f32>(0xff7fffffu); // f32::MIN
    var run_max = neg_inf();
    var run_sum = 0.0;
    var acc = 0.0;
    for (var j0 = 0u; j0 < seq; j0 += 256u) {
        let j = j0 + lid;
        var s = neg_inf();
        if (j < seq) {
            if (prm(2u) != 0u && mask[prm(1u) + b * seq + j] == 0.0) {
                s = padded;
            } else {
                let kj = k0 + j * width;
                var dot = 0.0;
                for (var c = 0u; c < d; c++) {
                    dot += f32(qkv[q + c]) * f32(qkv[kj + c]);
                }
                s = dot;
            }
        }
        // Every chunk holds at least one key (j0 < seq), so the new max is finite and the
        // first rescale multiplies by exp(-inf) = 0.
        let new_max = max(run_max, tree_max(lid, s));
        let scale = exp(run_max - new_max);
        var e = 0.0;
        if (j < seq) {
            e = exp(s - new_max);
        }
        probs[lid] = e;
        // tree_sum's barriers also publish `probs`.
        run_sum = run_sum * scale + tree_sum(lid, e);
        run_max = new_max;
        if (lid < d) {
            var a = acc * scale;
            let n = min(256u, seq - j0);
            for (var t = 0u; t < n; t++) {
                a += probs[t] * f32(qkv[v0 + (j0 + t) * width + lid]);
            }
            acc = a;
        }
        // `probs` is overwritten by the next chunk.
        workgroupBarrier();
    }
    if (lid < d) {
        out[prm(3u) + token * hidden + h * d + lid] = T(acc / run_sum);
    }
}
