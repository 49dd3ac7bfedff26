//! Row normalizations: softmax and (residual +) LayerNorm.

use crate::backend::DevicePtr;

use super::{dst, src};

/// `Kernel::Softmax` in `f32` over rows of `cols` (`cols > 0`).
///
/// # Safety
/// `x` is valid for `rows * cols` reads and `out` for as many writes.
pub(super) unsafe fn softmax(x: DevicePtr, out: DevicePtr, rows: usize, cols: usize) {
    let (x, y) = (src(x, rows * cols), dst(out, rows * cols));
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        let max = xr.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        // f64 accumulation: an f32 running sum drifts past 1e-5 on long rows.
        let mut sum = 0.0f64;
        for (y, &x) in yr.iter_mut().zip(xr) {
            *y = (x - max).exp();
            sum += *y as f64;
        }
        let inv = (1.0 / sum) as f32;
        yr.iter_mut().for_each(|y| *y *= inv);
    }
}

/// `Kernel::LayerNorm` in `f32`: `out = layer_norm(x + residual) * gamma + beta` per row.
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
    let (x, y) = (src(x, n), dst(out, n));
    let res = residual.map(|r| src(r, n));
    let (g, bt) = (src(gamma, c), src(beta, c));
    for r in 0..rows {
        let yr = &mut y[r * c..(r + 1) * c];
        yr.copy_from_slice(&x[r * c..(r + 1) * c]);
        if let Some(res) = res {
            yr.iter_mut()
                .zip(&res[r * c..(r + 1) * c])
                .for_each(|(y, &r)| *y += r);
        }
        // f64 accumulation keeps the statistics accurate for wide rows at no real cost.
        let mean = yr.iter().map(|&v| v as f64).sum::<f64>() / c as f64;
        let var = yr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / c as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for ((y, &g), &b) in yr.iter_mut().zip(g).zip(bt) {
            *y = ((*y as f64 - mean) * inv) as f32 * g + b;
        }
    }
}
