//! Activations applied after a product (the CPU form of the matmul epilogue), and the tanh
//! GELU they and the bias kernel share: the reference the CUDA epilogues are checked
//! against, split over the intra-op pool like the other element-wise kernels.

use crate::backend::DevicePtr;
use crate::kernel::Activation;

use crate::cpu::intra_op;

use super::simd::multiversion;
use super::{dst_at, gelu};

/// GELU in its tanh approximation (Hugging Face's `gelu_new`, cuBLASLt's GELU epilogue):
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`, evaluated in `f64`.
#[inline]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let inner = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (0.5 * x * (1.0 + inner.tanh())) as f32
}

/// `act(v)` for every activation the kernels take.
#[inline]
pub(crate) fn activate(act: Activation, v: f32) -> f32 {
    match act {
        Activation::Identity => v,
        Activation::Relu => v.max(0.0),
        Activation::Gelu => gelu(v),
        Activation::GeluTanh => gelu_tanh(v),
    }
}

/// Applies `act` in place to `len` `f32` values at `out` (after `Kernel::Matmul`'s product
/// and bias).
///
/// # Safety
/// `out` is valid for `len` reads and writes and nothing else accesses it meanwhile.
pub(super) unsafe fn apply(out: DevicePtr, len: usize, act: Activation) {
    if act == Activation::Identity {
        return;
    }
    intra_op::for_ranges(len, 8, |r| apply_piece(dst_at(out, r.start, r.len()), act));
}

multiversion! {
    /// `act` in place over `y` (one task's piece, or one row of a matmul tile).
    pub(super) unsafe fn apply_piece(y: &mut [f32], act: Activation) {
        y.iter_mut().for_each(|v| *v = activate(act, *v));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tanh_gelu_is_close_to_erf_gelu_and_exact_at_landmarks() {
        assert_eq!(gelu_tanh(0.0), 0.0);
        // Far out the two forms agree with the identity and with zero.
        assert!((gelu_tanh(10.0) - 10.0).abs() < 1e-6);
        assert!(gelu_tanh(-10.0).abs() < 1e-6);
        // The approximation's largest gap to the erf form is about 5e-4 (near |x| = 2).
        let worst = (-600..600)
            .map(|i| i as f32 / 100.0)
            .map(|x| (gelu_tanh(x) - gelu(x)).abs())
            .fold(0.0f32, f32::max);
        assert!(worst > 1e-5 && worst < 1e-3, "worst gap {worst}");
        // A value computed by hand: tanh(sqrt(2/pi) * 1.044715) = 0.6858...
        assert!((gelu_tanh(1.0) - 0.841_192).abs() < 1e-5);
    }
}
