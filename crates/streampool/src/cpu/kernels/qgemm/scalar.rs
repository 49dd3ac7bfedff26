//! The portable path: the same packing and arithmetic as the vector kernels, one row at a
//! time (hosts without AVX2, and strided activations).

use super::{dequantize, quantize_value, scales_of, Tile, NR};

/// Quantizes one activation row of `out.len()` values read by `at(p)`: writes `qa` and
/// returns the row's scale (NaN when the row holds a NaN or an infinity).
#[inline(always)]
pub(super) fn quantize_row(at: impl Fn(usize) -> f32, out: &mut [i16]) -> f32 {
    let k = out.len();
    let mut amax = 0.0f32;
    let mut finite = true;
    for p in 0..k {
        let x = at(p);
        finite &= x.is_finite();
        amax = amax.max(x.abs());
    }
    if !finite {
        out.fill(0);
        return f32::NAN;
    }
    let (scale, inv) = scales_of(amax);
    for (p, q) in out.iter_mut().enumerate() {
        *q = quantize_value(at(p), inv);
    }
    scale
}

/// One row of a tile (`t.a` is the row, `t.c` its output).
///
/// # Safety
/// `t`'s pointers are valid for one row as [`Tile`] says.
pub(super) unsafe fn row(t: &Tile) {
    let mut acc = [0i32; NR];
    for s in 0..t.steps {
        let (x0, x1) = (
            i32::from(t.a.add(2 * s).read()),
            i32::from(t.a.add(2 * s + 1).read()),
        );
        let w = t.w.add(s * 2 * NR);
        for (j, a) in acc.iter_mut().enumerate() {
            *a += x0 * i32::from(w.add(2 * j).read()) + x1 * i32::from(w.add(2 * j + 1).read());
        }
    }
    let sa = t.a_scales.read();
    let mut y = [0.0f32; NR];
    for j in 0..NR {
        y[j] = dequantize(acc[j], sa, t.w_scales.add(j).read(), t.bias.add(j).read());
    }
    let y = &mut y[..t.cols];
    super::super::sgemm::activate_row(y, t.act);
    std::ptr::copy_nonoverlapping(y.as_ptr(), t.c, t.cols);
}
