//! Sentence pooling.

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::{dst_at, src};

/// `Kernel::MeanPoolNorm` in `f32`, sums in `f64`; sentences are split over the intra-op pool.
///
/// # Safety
/// `x` is valid for `batch * seq * dim` reads, `mask` for `batch * seq`, `out` for
/// `batch * dim` writes.
pub(super) unsafe fn mean_pool_norm(
    x: DevicePtr,
    mask: DevicePtr,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    dim: usize,
) {
    intra_op::for_ranges(batch, seq * dim, |r| {
        let (x, m) = (src(x, batch * seq * dim), src(mask, batch * seq));
        let y = dst_at(out, r.start * dim, r.len() * dim);
        let mut acc = vec![0.0f64; dim];
        for b in r.clone() {
            acc.fill(0.0);
            let mut count = 0.0f64;
            for s in 0..seq {
                let w = m[b * seq + s] as f64;
                count += w;
                if w != 0.0 {
                    let row = &x[(b * seq + s) * dim..][..dim];
                    acc.iter_mut()
                        .zip(row)
                        .for_each(|(a, &v)| *a += w * v as f64);
                }
            }
            let count = count.max(1e-9);
            let norm = acc
                .iter()
                .map(|a| (a / count).powi(2))
                .sum::<f64>()
                .sqrt()
                .max(1e-12);
            for (o, a) in y[(b - r.start) * dim..][..dim].iter_mut().zip(&acc) {
                *o = (a / count / norm) as f32;
            }
        }
    });
}
