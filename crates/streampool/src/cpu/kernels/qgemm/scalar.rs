//! The portable path: the same packing and arithmetic as the vector kernels, one row at a
//! time (hosts without AVX2).

use super::pack::KSTEP;
use super::{add_group, Tile, GROUP, NR};

/// One row of a tile (`t.a` is the row, `t.c` its output).
///
/// # Safety
/// `t`'s pointers are valid for one row as [`Tile`] says.
pub(super) unsafe fn row(t: &Tile) {
    let mut sum = [0.0f32; NR];
    for g in 0..t.groups {
        let s0 = g * GROUP / KSTEP;
        let s1 = (s0 + GROUP / KSTEP).min(t.steps);
        let info = &*t.info.add(g);
        let mut acc = info.correction;
        for s in s0..s1 {
            let x: [i32; KSTEP] = std::array::from_fn(|e| i32::from(t.a.add(KSTEP * s + e).read()));
            let w = t.w.add(s * KSTEP * NR);
            for (j, a) in acc.iter_mut().enumerate() {
                for (e, x) in x.iter().enumerate() {
                    *a += x * i32::from(w.add(KSTEP * j + e).read());
                }
            }
        }
        let sa = t.a_scales.add(g).read();
        for j in 0..NR {
            sum[j] = add_group(sum[j], acc[j], sa, info.scale[j]);
        }
    }
    let mut y = [0.0f32; NR];
    for j in 0..NR {
        y[j] = sum[j] + t.bias.add(j).read();
    }
    let y = &mut y[..t.cols];
    super::super::sgemm::activate_row(y, t.act);
    std::ptr::copy_nonoverlapping(y.as_ptr(), t.c, t.cols);
}
