//! Sentence pooling.

use crate::backend::DevicePtr;

use super::{dst, src};

/// `Kernel::MeanPoolNorm` in `f32`, sums in `f64`.
pub(super) unsafe fn mean_pool_norm(
    x: DevicePtr,
    mask: DevicePtr,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    dim: usize,
) {
    let (x, m, y) = (
        src(x, batch * seq * dim),
        src(mask, batch * seq),
        dst(out, batch * dim),
    );
    let mut acc = vec![0.0f64; dim];
    for b in 0..batch {
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
        for (o, a) in y[b * dim..][..dim].iter_mut().zip(&acc) {
            *o = (a / count / norm) as f32;
        }
    }
}
