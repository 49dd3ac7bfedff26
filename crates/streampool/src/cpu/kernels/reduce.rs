//! Reductions over one axis.

use crate::backend::DevicePtr;
use crate::kernel::ReduceOp;

use super::{dst, src};

/// `Kernel::Reduce` in `f32` over the middle axis of `[outer, axis, inner]`.
///
/// # Safety
/// `x` is valid for `outer * axis * inner` reads and `out` for `outer * inner` writes.
pub(super) unsafe fn reduce(
    op: ReduceOp,
    x: DevicePtr,
    out: DevicePtr,
    outer: usize,
    axis: usize,
    inner: usize,
) {
    if outer * inner == 0 {
        // An empty output; the input's `outer * axis * inner` need not even fit a usize.
        return;
    }
    let (x, y) = (src(x, outer * axis * inner), dst(out, outer * inner));
    for o in 0..outer {
        for i in 0..inner {
            let vals = (0..axis).map(|a| x[(o * axis + a) * inner + i]);
            // Sums accumulate in f64: an f32 running sum of 2^20 positive values
            // is off by more than 1e-5 relative.
            let sum = || vals.clone().map(f64::from).sum::<f64>();
            y[o * inner + i] = match op {
                ReduceOp::Sum => sum() as f32,
                ReduceOp::Mean => (sum() / axis as f64) as f32,
                ReduceOp::Max => vals.clone().fold(f32::NEG_INFINITY, f32::max),
            };
        }
    }
}
