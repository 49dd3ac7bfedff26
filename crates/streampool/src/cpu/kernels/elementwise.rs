//! Element-wise kernels: unary functions and the fused bias + activation, vectorized and
//! split over the intra-op pool.

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{Activation, UnaryOp};

use super::simd::{self, multiversion};
use super::{dst_at, src};

/// `Kernel::Unary` in `f32`.
///
/// # Safety
/// `x` is valid for `len` reads and `out` for `len` writes.
pub(super) unsafe fn unary(op: UnaryOp, x: DevicePtr, out: DevicePtr, len: usize) {
    // Transcendental functions cost far more than a load: count them as more work, so that
    // they go parallel sooner.
    let cost = match op {
        UnaryOp::Gelu | UnaryOp::Tanh | UnaryOp::Exp => 8,
        _ => 1,
    };
    intra_op::for_ranges(len, cost, |r| {
        unary_piece(op, &src(x, len)[r.clone()], dst_at(out, r.start, r.len()))
    });
}

multiversion! {
    unsafe fn unary_piece(op: UnaryOp, x: &[f32], y: &mut [f32]) {
        match op {
            UnaryOp::Relu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.max(0.0)),
            UnaryOp::Gelu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = simd::gelu(x)),
            UnaryOp::Tanh => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.tanh()),
            UnaryOp::Exp => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.exp()),
            UnaryOp::Sqrt => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.sqrt()),
            UnaryOp::Sqr => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * x),
            UnaryOp::Neg => y.iter_mut().zip(x).for_each(|(y, &x)| *y = -x),
            UnaryOp::Recip => y.iter_mut().zip(x).for_each(|(y, &x)| *y = 1.0 / x),
            UnaryOp::Affine { mul, add } => {
                y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * mul + add)
            }
        }
    }
}

/// `Kernel::BiasAct` in `f32`: `out = act(x + bias)` over rows of `cols` (`cols > 0`).
///
/// # Safety
/// `x` is valid for `rows * cols` reads, `bias` for `cols` reads, `out` for `rows * cols` writes.
pub(super) unsafe fn bias_act(
    x: DevicePtr,
    bias: DevicePtr,
    out: DevicePtr,
    rows: usize,
    cols: usize,
    act: Activation,
) {
    let n = rows * cols;
    let cost = match act {
        Activation::Gelu | Activation::GeluTanh => 8 * cols,
        _ => cols,
    };
    let b = src(bias, cols);
    intra_op::for_ranges(rows, cost, |r| {
        let x = &src(x, n)[r.start * cols..r.end * cols];
        bias_act_rows(x, b, dst_at(out, r.start * cols, r.len() * cols), act)
    });
}

multiversion! {
    unsafe fn bias_act_rows(x: &[f32], b: &[f32], y: &mut [f32], act: Activation) {
        let cols = b.len();
        for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
            match act {
                Activation::Identity => {
                    yr.iter_mut().zip(xr).zip(b).for_each(|((y, &x), &b)| *y = x + b)
                }
                Activation::Relu => yr
                    .iter_mut()
                    .zip(xr)
                    .zip(b)
                    .for_each(|((y, &x), &b)| *y = (x + b).max(0.0)),
                Activation::Gelu => yr
                    .iter_mut()
                    .zip(xr)
                    .zip(b)
                    .for_each(|((y, &x), &b)| *y = simd::gelu(x + b)),
                Activation::GeluTanh => yr
                    .iter_mut()
                    .zip(xr)
                    .zip(b)
                    .for_each(|((y, &x), &b)| *y = super::gelu_tanh(x + b)),
            }
        }
    }
}
