//! Matrix products.

use crate::backend::DevicePtr;
use crate::kernel::MatOperand;

use super::{dst, src};

/// `Kernel::Matmul` in `f32`: `out[b] = a[b] @ b[b] (+ bias)`.
///
/// # Safety
/// The operands are valid for `[batch, m, k]` and `[batch, k, n]` under their strides, `out`
/// for `batch * m * n` writes and `bias` for `n` reads; `out` aliases neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
    bias: Option<DevicePtr>,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    for bi in 0..batch {
        let pa = (a.ptr.0 as *const f32).add(bi * a.batch_stride);
        let pb = (b.ptr.0 as *const f32).add(bi * b.batch_stride);
        let pc = (out.0 as *mut f32).add(bi * m * n);
        matrixmultiply::sgemm(
            m,
            k,
            n,
            1.0,
            pa,
            a.rs as isize,
            a.cs as isize,
            pb,
            b.rs as isize,
            b.cs as isize,
            0.0,
            pc,
            n as isize,
            1,
        );
    }
    if let Some(bias) = bias {
        let bias = src(bias, n);
        if n > 0 {
            for row in dst(out, batch * m * n).chunks_exact_mut(n) {
                row.iter_mut().zip(bias).for_each(|(y, &b)| *y += b);
            }
        }
    }
}
