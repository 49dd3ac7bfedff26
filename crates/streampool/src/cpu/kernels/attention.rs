//! Fused multi-head self-attention over a packed QKV projection.

use std::ops::Range;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::simd::{self, multiversion};
use super::{dst_at, src};

/// `Kernel::Attention` in `f32`: one pool task per run of (sequence, head) pairs.
///
/// Each pair's keys are gathered transposed (`[head_dim, seq]`) and its values contiguous
/// (`[seq, head_dim]`), so that both products run as unit-stride multiply-adds that
/// vectorize: scores as `head_dim` rows of `seq` scaled by the query's components, outputs as
/// `seq` rows of `head_dim` scaled by the probabilities. Softmax statistics are `f32` (sums
/// of at most `seq` terms in 16 lanes); no score matrix is stored beyond one query's row.
///
/// # Safety
/// `qkv` is valid for `batch * seq * 3 * heads * head_dim` reads, `mask` for `batch * seq`,
/// `out` for `batch * seq * heads * head_dim` writes.
pub(super) unsafe fn attention(
    qkv: DevicePtr,
    mask: Option<DevicePtr>,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    heads: usize,
    d: usize,
) {
    let hidden = heads * d;
    let width = 3 * hidden;
    if seq == 0 || d == 0 {
        return;
    }
    let x = src(qkv, batch * seq * width);
    let mask = mask.map(|m| src(m, batch * seq));
    intra_op::for_ranges(batch * heads, 4 * seq * seq * d, |r| {
        pairs(x, mask, out, seq, heads, d, r)
    });
}

multiversion! {
    /// The (sequence, head) pairs `items` of [`attention`].
    ///
    /// # Safety
    /// As for [`attention`]; no other task writes these pairs' outputs.
    unsafe fn pairs(
        x: &[f32],
        mask: Option<&[f32]>,
        out: DevicePtr,
        seq: usize,
        heads: usize,
        d: usize,
        items: Range<usize>,
    ) {
        let hidden = heads * d;
        let width = 3 * hidden;
        let mut kt = vec![0.0f32; d * seq];
        let mut v = vec![0.0f32; seq * d];
        let mut keep = vec![0.0f32; seq];
        let mut p = vec![0.0f32; seq];
        let mut o = vec![0.0f32; d];
        for item in items {
            let (b, h) = (item / heads, item % heads);
            let tok = |j: usize| &x[(b * seq + j) * width..(b * seq + j + 1) * width];
            for j in 0..seq {
                let t = tok(j);
                let k = &t[hidden + h * d..hidden + (h + 1) * d];
                for (c, &kc) in k.iter().enumerate() {
                    kt[c * seq + j] = kc;
                }
                v[j * d..(j + 1) * d].copy_from_slice(&t[2 * hidden + h * d..][..d]);
            }
            // 1 for keys that count, 0 for padding.
            let any = match mask {
                Some(m) => {
                    let m = &m[b * seq..(b + 1) * seq];
                    keep.iter_mut()
                        .zip(m)
                        .for_each(|(k, &m)| *k = if m == 0.0 { 0.0 } else { 1.0 });
                    m.iter().any(|&m| m != 0.0)
                }
                None => {
                    keep.fill(1.0);
                    true
                }
            };
            for i in 0..seq {
                let q = &tok(i)[h * d..(h + 1) * d];
                if any {
                    p.fill(0.0);
                    for (c, &qc) in q.iter().enumerate() {
                        simd::axpy(&mut p, qc, &kt[c * seq..(c + 1) * seq]);
                    }
                    let mut max = f32::NEG_INFINITY;
                    for (&s, &k) in p.iter().zip(&keep) {
                        max = max.max(if k != 0.0 { s } else { f32::NEG_INFINITY });
                    }
                    // Padding keys get weight exactly 0 (exp is finite for any input).
                    p.iter_mut()
                        .zip(&keep)
                        .for_each(|(s, &k)| *s = simd::exp(*s - max) * k);
                } else {
                    // Every key is padding: a uniform row, as Hugging Face's additive
                    // `f32::MIN` mask gives.
                    p.fill(1.0);
                }
                let inv = 1.0 / simd::sum_f64(&p) as f32;
                o.fill(0.0);
                for (j, &pj) in p.iter().enumerate() {
                    simd::axpy(&mut o, pj, &v[j * d..(j + 1) * d]);
                }
                let y = dst_at(out, (b * seq + i) * hidden + h * d, d);
                y.iter_mut().zip(&o).for_each(|(y, &o)| *y = o * inv);
            }
        }
    }
}
