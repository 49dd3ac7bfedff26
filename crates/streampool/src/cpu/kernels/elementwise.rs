//! Element-wise kernels: unary functions and the fused bias + activation.

use crate::backend::DevicePtr;
use crate::kernel::{Activation, UnaryOp};

use super::{dst, gelu, src};

/// `Kernel::Unary` in `f32`.
///
/// # Safety
/// `x` is valid for `len` reads and `out` for `len` writes.
pub(super) unsafe fn unary(op: UnaryOp, x: DevicePtr, out: DevicePtr, len: usize) {
    let (x, y) = (src(x, len), dst(out, len));
    match op {
        UnaryOp::Relu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.max(0.0)),
        UnaryOp::Gelu => y.iter_mut().zip(x).for_each(|(y, &x)| *y = gelu(x)),
        UnaryOp::Tanh => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.tanh()),
        UnaryOp::Exp => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.exp()),
        UnaryOp::Sqrt => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x.sqrt()),
        UnaryOp::Sqr => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * x),
        UnaryOp::Neg => y.iter_mut().zip(x).for_each(|(y, &x)| *y = -x),
        UnaryOp::Recip => y.iter_mut().zip(x).for_each(|(y, &x)| *y = 1.0 / x),
        UnaryOp::Affine { mul, add } => y.iter_mut().zip(x).for_each(|(y, &x)| *y = x * mul + add),
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
    let (x, y, b) = (src(x, rows * cols), dst(out, rows * cols), src(bias, cols));
    for (xr, yr) in x.chunks_exact(cols).zip(y.chunks_exact_mut(cols)) {
        for ((y, &x), &b) in yr.iter_mut().zip(xr).zip(b) {
            let v = x + b;
            *y = match act {
                Activation::Identity => v,
                Activation::Relu => v.max(0.0),
                Activation::Gelu => gelu(v),
                Activation::GeluTanh => super::gelu_tanh(v),
            };
        }
    }
}
