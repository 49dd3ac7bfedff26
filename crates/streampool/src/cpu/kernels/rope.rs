//! Rotary position embeddings, rotate-half form: a plain loop, the reference for other
//! backends.

use crate::backend::DevicePtr;

use super::{dst, src};

/// `Kernel::Rope` in `f32` on `[batch, seq, heads, head_dim]` (`head_dim` even, > 0): heads
/// `0..rotated` rotated, the others copied.
///
/// # Safety
/// `x` is valid for `batch * seq * heads * head_dim` reads and `out` for as many writes;
/// `cos` and `sin` for `seq * head_dim / 2` reads.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rope(
    x: DevicePtr,
    cos: DevicePtr,
    sin: DevicePtr,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    heads: usize,
    head_dim: usize,
    rotated: usize,
) {
    let n = batch * seq * heads * head_dim;
    let half = head_dim / 2;
    let (x, y) = (src(x, n), dst(out, n));
    let (cos, sin) = (src(cos, seq * half), src(sin, seq * half));
    for (row, (xr, yr)) in x
        .chunks_exact(head_dim)
        .zip(y.chunks_exact_mut(head_dim))
        .enumerate()
    {
        // Rows are (batch, position, head) in that order.
        if row % heads >= rotated {
            yr.copy_from_slice(xr);
            continue;
        }
        let p = (row / heads) % seq;
        let (c, s) = (
            &cos[p * half..(p + 1) * half],
            &sin[p * half..(p + 1) * half],
        );
        let (x1, x2) = xr.split_at(half);
        let (y1, y2) = yr.split_at_mut(half);
        for i in 0..half {
            y1[i] = x1[i] * c[i] - x2[i] * s[i];
            y2[i] = x2[i] * c[i] + x1[i] * s[i];
        }
    }
}
