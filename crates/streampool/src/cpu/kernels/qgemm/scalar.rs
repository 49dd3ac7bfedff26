//! The portable path: the same packing and arithmetic as the vector kernels, one row at a
//! time (hosts without AVX2, and strided activations).

use super::{add_group, dequantize, quantize_value, scales_of, Tile, GROUP, NR};

/// Quantizes one group of `out.len()` activations read by `at(i)` into `out`: returns its
/// scale and whether every value was finite (else `out` is zeros).
#[inline(always)]
pub(super) fn quantize_group(at: impl Fn(usize) -> f32, out: &mut [i16]) -> (f32, bool) {
    let mut amax = 0.0f32;
    let mut finite = true;
    for i in 0..out.len() {
        let x = at(i);
        finite &= x.is_finite();
        amax = amax.max(x.abs());
    }
    if !finite {
        out.fill(0);
        return (f32::NAN, false);
    }
    let (scale, inv) = scales_of(amax);
    for (i, q) in out.iter_mut().enumerate() {
        *q = quantize_value(at(i), inv);
    }
    (scale, true)
}

/// One row of a tile (`t.a` is the row, `t.c` its output).
///
/// # Safety
/// `t`'s pointers are valid for one row as [`Tile`] says.
pub(super) unsafe fn row(t: &Tile) {
    let mut sum = [0.0f32; NR];
    for g in 0..t.groups {
        let s0 = g * GROUP / 2;
        let s1 = (s0 + GROUP / 2).min(t.steps);
        let mut acc = [0i32; NR];
        for s in s0..s1 {
            let (x0, x1) = (
                i32::from(t.a.add(2 * s).read()),
                i32::from(t.a.add(2 * s + 1).read()),
            );
            let w = t.w.add(s * 2 * NR);
            for (j, a) in acc.iter_mut().enumerate() {
                *a += x0 * i32::from(w.add(2 * j).read()) + x1 * i32::from(w.add(2 * j + 1).read());
            }
        }
        let sa = t.a_scales.add(g).read();
        for j in 0..NR {
            sum[j] = add_group(sum[j], acc[j], sa);
        }
    }
    let mut y = [0.0f32; NR];
    for j in 0..NR {
        y[j] = dequantize(sum[j], t.w_scales.add(j).read(), t.bias.add(j).read());
    }
    let y = &mut y[..t.cols];
    super::super::sgemm::activate_row(y, t.act);
    std::ptr::copy_nonoverlapping(y.as_ptr(), t.c, t.cols);
}
