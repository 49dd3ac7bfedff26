//! Packed (varlen) batches: sequences of different lengths back to back, with offsets
//! ([`SeqOffsets`]). Plain single-threaded loops: the reference for the CUDA kernels, which
//! clamp the offsets the same way ([`seq_range`]).

use crate::backend::DevicePtr;
use crate::kernel::SeqOffsets;

use super::{dst, src};

/// Rows `start..start + len` of sequence `b`: the offsets clamped to `0..tokens` (and the
/// length to `max_len`), so bad offsets never reach outside the tensors.
pub(crate) fn seq_range(
    offsets: &[i64],
    b: usize,
    tokens: usize,
    max_len: usize,
) -> (usize, usize) {
    let clamp = |v: i64, lo: usize| (v.max(0) as u64).clamp(lo as u64, tokens as u64) as usize;
    let start = clamp(offsets[b], 0);
    let end = clamp(offsets[b + 1], start);
    (start, (end - start).min(max_len))
}

/// The `batch + 1` offsets of `seqs`.
///
/// # Safety
/// `seqs.ptr` is valid for `batch + 1` reads of `i64`.
pub(crate) unsafe fn offsets<'a>(seqs: &SeqOffsets, batch: usize) -> &'a [i64] {
    std::slice::from_raw_parts(seqs.ptr.0 as *const i64, batch + 1)
}

/// `Kernel::Attention` with `packed` set, in `f32`: each sequence attends to itself only.
///
/// # Safety
/// `qkv` holds `seqs.tokens * 3 * heads * d` `f32`, `out` `seqs.tokens * heads * d`, and
/// `seqs.ptr` `batch + 1` offsets.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn attention(
    qkv: DevicePtr,
    seqs: &SeqOffsets,
    out: DevicePtr,
    batch: usize,
    max_len: usize,
    heads: usize,
    d: usize,
) {
    let (hidden, tokens) = (heads * d, seqs.tokens);
    let width = 3 * hidden;
    let x = src(qkv, tokens * width);
    let y = dst(out, tokens * hidden);
    let offsets = offsets(seqs, batch);
    let mut p = Vec::new();
    for b in 0..batch {
        let (start, len) = seq_range(offsets, b, tokens, max_len);
        let tok = |j: usize| &x[(start + j) * width..(start + j + 1) * width];
        p.resize(len, 0.0f32);
        for h in 0..heads {
            for i in 0..len {
                let q = &tok(i)[h * d..(h + 1) * d];
                let mut max = f32::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate() {
                    let k = &tok(j)[hidden + h * d..hidden + (h + 1) * d];
                    *pj = q.iter().zip(k).map(|(a, b)| a * b).sum();
                    max = max.max(*pj);
                }
                let mut sum = 0.0f64;
                for pj in p.iter_mut() {
                    *pj = (*pj - max).exp();
                    sum += f64::from(*pj);
                }
                let inv = (1.0 / sum) as f32;
                let yr = &mut y[(start + i) * hidden + h * d..][..d];
                yr.fill(0.0);
                for (j, &pj) in p.iter().enumerate() {
                    let v = &tok(j)[2 * hidden + h * d..2 * hidden + (h + 1) * d];
                    yr.iter_mut().zip(v).for_each(|(o, &v)| *o += pj * v);
                }
                yr.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}

/// `Kernel::MeanPoolNormPacked` in `f32`, sums in `f64`.
///
/// # Safety
/// `x` holds `seqs.tokens * dim` `f32`, `out` `batch * dim`, `seqs.ptr` `batch + 1` offsets.
pub(super) unsafe fn mean_pool_norm(
    x: DevicePtr,
    seqs: &SeqOffsets,
    out: DevicePtr,
    batch: usize,
    dim: usize,
) {
    let tokens = seqs.tokens;
    let (x, y) = (src(x, tokens * dim), dst(out, batch * dim));
    let offsets = offsets(seqs, batch);
    let mut acc = vec![0.0f64; dim];
    for b in 0..batch {
        let (start, len) = seq_range(offsets, b, tokens, usize::MAX);
        acc.fill(0.0);
        for row in x[start * dim..(start + len) * dim].chunks_exact(dim.max(1)) {
            acc.iter_mut()
                .zip(row)
                .for_each(|(a, &v)| *a += f64::from(v));
        }
        // sentence-transformers' floors: the count at 1e-9, the norm at 1e-12.
        let count = (len as f64).max(1e-9);
        let norm = acc
            .iter()
            .map(|a| (a / count).powi(2))
            .sum::<f64>()
            .sqrt()
            .max(1e-12);
        for (o, a) in y[b * dim..][..dim].iter_mut().zip(&acc) {
            *o = (a / count / norm) as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::seq_range;

    #[test]
    fn bad_offsets_are_clamped_inside_the_tokens() {
        let off = [0i64, 3, 2, 9, -4];
        assert_eq!(seq_range(&off, 0, 8, 16), (0, 3));
        assert_eq!(seq_range(&off, 1, 8, 16), (3, 0)); // decreasing: empty
        assert_eq!(seq_range(&off, 2, 8, 16), (2, 6)); // past the end: cut at 8
        assert_eq!(seq_range(&off, 2, 8, 4), (2, 4)); // longer than max_len
        assert_eq!(seq_range(&off, 3, 8, 16), (8, 0)); // negative end
    }
}
