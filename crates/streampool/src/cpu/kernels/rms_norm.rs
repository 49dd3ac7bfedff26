//! RMS normalisation (T5, Llama, Qwen): a plain loop, the reference for other backends.

use crate::backend::DevicePtr;

use super::{dst, src};

/// `Kernel::RmsNorm` in `f32`: `out = x / sqrt(mean(x^2) + eps) * gamma` per row of `cols`.
///
/// # Safety
/// `x` is valid for `rows * cols` reads, `gamma` for `cols` reads, `out` for `rows * cols`
/// writes.
pub(super) unsafe fn rms_norm(
    x: DevicePtr,
    gamma: DevicePtr,
    out: DevicePtr,
    rows: usize,
    cols: usize,
    eps: f32,
) {
    let (x, y, g) = (src(x, rows * cols), dst(out, rows * cols), src(gamma, cols));
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        // f64 accumulation, as the LayerNorm kernel: exact enough for wide rows.
        let ms = xr.iter().map(|&v| (v as f64) * (v as f64)).sum::<f64>() / cols as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        for ((y, &x), &g) in yr.iter_mut().zip(xr).zip(g) {
            *y = (x as f64 * inv) as f32 * g;
        }
    }
}
