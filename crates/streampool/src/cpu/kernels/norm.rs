//! Row normalizations: softmax and (residual +) LayerNorm, one run of rows per task.

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::simd::{self, multiversion};
use super::{dst_at, src};

/// `Kernel::Softmax` in `f32` over rows of `cols` (`cols > 0`).
///
/// # Safety
/// `x` is valid for `rows * cols` reads and `out` for as many writes.
pub(super) unsafe fn softmax(x: DevicePtr, out: DevicePtr, rows: usize, cols: usize) {
    let n = rows * cols;
    intra_op::for_ranges(rows, 8 * cols, |r| {
        let x = &src(x, n)[r.start * cols..r.end * cols];
        softmax_rows(x, dst_at(out, r.start * cols, r.len() * cols), cols)
    });
}

multiversion! {
    unsafe fn softmax_rows(x: &[f32], y: &mut [f32], cols: usize) {
        for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
            yr.copy_from_slice(xr);
            simd::softmax_in_place(yr, None);
        }
    }
}

/// `Kernel::LayerNorm` in `f32`: `out = layer_norm(x + residual) * gamma + beta` per row.
/// Statistics are accumulated in `f64` (exact enough for any row width, and still vectorized).
///
/// # Safety
/// `x`, `residual` (if any) are valid for `rows * cols` reads, `gamma` and `beta` for `cols`
/// reads, `out` for `rows * cols` writes.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn layer_norm(
    x: DevicePtr,
    residual: Option<DevicePtr>,
    gamma: DevicePtr,
    beta: DevicePtr,
    out: DevicePtr,
    rows: usize,
    cols: usize,
    eps: f32,
) {
    let (n, c) = (rows * cols, cols);
    if c == 0 {
        return;
    }
    let (g, bt) = (src(gamma, c), src(beta, c));
    intra_op::for_ranges(rows, 4 * c, |r| {
        let x = &src(x, n)[r.start * c..r.end * c];
        let res = residual.map(|p| &src(p, n)[r.start * c..r.end * c]);
        layer_norm_rows(x, res, g, bt, dst_at(out, r.start * c, r.len() * c), eps)
    });
}

multiversion! {
    unsafe fn layer_norm_rows(
        x: &[f32],
        res: Option<&[f32]>,
        g: &[f32],
        bt: &[f32],
        y: &mut [f32],
        eps: f32,
    ) {
        let c = g.len();
        for (i, yr) in y.chunks_exact_mut(c).enumerate() {
            let xr = &x[i * c..(i + 1) * c];
            match res {
                Some(res) => yr
                    .iter_mut()
                    .zip(xr)
                    .zip(&res[i * c..(i + 1) * c])
                    .for_each(|((y, &x), &r)| *y = x + r),
                None => yr.copy_from_slice(xr),
            }
            let mean = simd::sum_f64(yr) / c as f64;
            let var = simd::sq_dev_f64(yr, mean) / c as f64;
            let inv = (1.0 / (var + eps as f64).sqrt()) as f32;
            let mean = mean as f32;
            yr.iter_mut()
                .zip(g)
                .zip(bt)
                .for_each(|((y, &g), &b)| *y = (*y - mean) * inv * g + b);
        }
    }
}
