//! Gated activations (GeGLU, SwiGLU) over a fused gate/up projection: a plain loop, the
//! reference for other backends.

use crate::backend::DevicePtr;
use crate::kernel::GateActivation;

use super::simd::gelu;
use super::{dst, src};

/// `Kernel::GatedAct` in `f32`: `out[r, c] = act(x[r, c]) * x[r, cols + c]` (`cols > 0`).
///
/// # Safety
/// `x` is valid for `rows * 2 * cols` reads and `out` for `rows * cols` writes.
pub(super) unsafe fn gated_act(
    x: DevicePtr,
    out: DevicePtr,
    rows: usize,
    cols: usize,
    act: GateActivation,
) {
    let (x, y) = (src(x, rows * 2 * cols), dst(out, rows * cols));
    for (xr, yr) in x.chunks_exact(2 * cols).zip(y.chunks_exact_mut(cols)) {
        let (gate, up) = xr.split_at(cols);
        for ((y, &g), &u) in yr.iter_mut().zip(gate).zip(up) {
            *y = gate_act(g, act) * u;
        }
    }
}

/// The gate's activation of one value.
fn gate_act(x: f32, act: GateActivation) -> f32 {
    match act {
        GateActivation::Gelu => gelu(x),
        GateActivation::GeluTanh => {
            // 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))), as PyTorch's "tanh" GELU.
            const K: f32 = 0.797_884_6;
            0.5 * x * (1.0 + (K * (x + 0.044_715 * x * x * x)).tanh())
        }
        GateActivation::Silu => x / (1.0 + (-x).exp()),
    }
}
