//! Fused multi-head self-attention over a packed QKV projection.

use crate::backend::DevicePtr;

use super::{dst, src};

/// `Kernel::Attention` in `f32`, one query at a time (the reference for the CUDA kernel).
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
    let x = src(qkv, batch * seq * width);
    let y = dst(out, batch * seq * hidden);
    let mask = mask.map(|m| src(m, batch * seq));
    let mut p = vec![0.0f32; seq];
    for b in 0..batch {
        let tok = |j: usize| &x[(b * seq + j) * width..(b * seq + j + 1) * width];
        for h in 0..heads {
            for i in 0..seq {
                let q = &tok(i)[h * d..(h + 1) * d];
                let mut max = f32::NEG_INFINITY;
                for (j, pj) in p.iter_mut().enumerate() {
                    let k = &tok(j)[hidden + h * d..hidden + (h + 1) * d];
                    // A padded key scores f32::MIN: exp underflows to 0 unless every key is
                    // padding, and then the row is uniform (Hugging Face's additive mask).
                    *pj = match mask {
                        Some(m) if m[b * seq + j] == 0.0 => f32::MIN,
                        _ => q.iter().zip(k).map(|(a, b)| a * b).sum(),
                    };
                    max = max.max(*pj);
                }
                let mut sum = 0.0f64;
                for pj in p.iter_mut() {
                    *pj = (*pj - max).exp();
                    sum += *pj as f64;
                }
                let inv = (1.0 / sum) as f32;
                let yr = &mut y[(b * seq + i) * hidden + h * d..][..d];
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
