//! Reductions over one axis.

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::ReduceOp;

use super::{dst_at, src};

/// `Kernel::Reduce` in `f32` over the middle axis of `[outer, axis, inner]`; outputs are
/// split over the intra-op pool.
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
    let outputs = outer * inner;
    if outputs == 0 {
        // An empty output; the input's `outer * axis * inner` need not even fit a usize.
        return;
    }
    intra_op::for_ranges(outputs, axis, |r| {
        let x = src(x, outer * axis * inner);
        let y = dst_at(out, r.start, r.len());
        for oi in r.clone() {
            let (o, i) = (oi / inner, oi % inner);
            let vals = (0..axis).map(|a| x[(o * axis + a) * inner + i]);
            // Sums accumulate in f64: an f32 running sum of 2^20 positive values
            // is off by more than 1e-5 relative.
            let sum = || vals.clone().map(f64::from).sum::<f64>();
            y[oi - r.start] = match op {
                ReduceOp::Sum => sum() as f32,
                ReduceOp::Mean => (sum() / axis as f64) as f32,
                ReduceOp::Max => vals.clone().fold(f32::NEG_INFINITY, f32::max),
            };
        }
    });
}
