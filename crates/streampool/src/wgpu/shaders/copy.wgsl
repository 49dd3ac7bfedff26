// p: [element size in bytes (2, 4 or 8), len, rank, src byte offset, out byte offset,
//     shape[rank], src strides[rank] (elements)]
// Works on 32-bit words: one invocation writes whole output words (two 2-byte elements, one
// 4-byte element or the two halves of an 8-byte one), so no two invocations share a word.
@group(0) @binding(1) var<storage, read> src: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

// Byte offset in `src` of element `e` (row-major over the shape).
fn src_byte(e: u32) -> u32 {
    let rank = prm(2u);
    let esize = prm(0u);
    var rem = e;
    var off = prm(3u);
    for (var k = 0u; k < rank; k++) {
        let d = rank - 1u - k;
        let n = prm(5u + d);
        off += (rem % n) * prm(5u + rank + d) * esize;
        rem = rem / n;
    }
    return off;
}

fn half_at(byte: u32) -> u32 {
    return (src[byte / 4u] >> ((byte % 4u) * 8u)) & 0xffffu;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear(wid, nwg, lid);
    let esize = prm(0u);
    let len = prm(1u);
    let out_word = prm(4u) / 4u;
    if (esize == 2u) {
        let e = 2u * i;
        if (e >= len) {
            return;
        }
        var w = half_at(src_byte(e));
        if (e + 1u < len) {
            w = w | (half_at(src_byte(e + 1u)) << 16u);
        }
        out[out_word + i] = w;
    } else if (esize == 4u) {
        if (i >= len) {
            return;
        }
        out[out_word + i] = src[src_byte(i) / 4u];
    } else {
        if (i >= len) {
            return;
        }
        let s = src_byte(i) / 4u;
        out[out_word + 2u * i] = src[s];
        out[out_word + 2u * i + 1u] = src[s + 1u];
    }
}
