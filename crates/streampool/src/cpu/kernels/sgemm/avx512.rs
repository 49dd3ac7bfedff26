//! The AVX-512 microkernel: 8 rows by 48 columns, 24 `zmm` accumulators; each step loads one
//! row of the packed panel (three vectors) and broadcasts one element of each row of `a`.

use std::arch::x86_64::*;

use super::{activate_row, Tile};
use crate::kernel::Activation;

/// Rows of the register tile.
pub(super) const MR: usize = 8;
/// Columns of the register tile: a packed panel's width.
pub(super) const NR: usize = 48;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
}

/// `R` rows of one tile (see [`Tile`]).
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `R` rows as [`Tile`] says.
// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile) {
    let mut acc = [[_mm512_setzero_ps(); 3]; R];
    if t.accumulate {
        // The partial sums of the earlier steps, a partial panel's through a buffer (copied
        // in a loop of its own: the loads below must unroll, as the stores at the end).
        let mut buf = [0.0f32; MR * NR];
        let (src, ld) = if t.cols == NR {
            (t.c as *const f32, t.ldc)
        } else {
            for r in 0..R {
                let to = buf.as_mut_ptr().add(r * NR);
                std::ptr::copy_nonoverlapping(t.c.add(r * t.ldc), to, t.cols);
            }
            (buf.as_ptr(), NR)
        };
        for r in 0..R {
            for q in 0..3 {
                acc[r][q] = _mm512_loadu_ps(src.add(r * ld + 16 * q));
            }
        }
    } else if !t.bias.is_null() {
        let v = [
            _mm512_loadu_ps(t.bias),
            _mm512_loadu_ps(t.bias.add(16)),
            _mm512_loadu_ps(t.bias.add(32)),
        ];
        acc = [v; R];
    }
    let rows: [*const f32; R] = std::array::from_fn(|r| t.a.add(r * t.rs));
    let mut w = t.w;
    for p in 0..t.k {
        let b = [
            _mm512_loadu_ps(w),
            _mm512_loadu_ps(w.add(16)),
            _mm512_loadu_ps(w.add(32)),
        ];
        let off = p * t.cs;
        for r in 0..R {
            let x = _mm512_set1_ps(rows[r].add(off).read());
            for q in 0..3 {
                acc[r][q] = _mm512_fmadd_ps(x, b[q], acc[r][q]);
            }
        }
        w = w.add(NR);
    }
    // Every accumulator is stored in small loops of its own (fully unrolled: an index
    // into `acc` that stays a variable would put the whole grid in memory, and the loop
    // above would then store it on every step, as the first version did).
    if t.cols == NR {
        for r in 0..R {
            for q in 0..3 {
                _mm512_storeu_ps(t.c.add(r * t.ldc + 16 * q), acc[r][q]);
            }
        }
        if t.act != Activation::Identity {
            for r in 0..R {
                activate_row(
                    std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), NR),
                    t.act,
                );
            }
        }
        return;
    }
    // A partial panel: through a buffer, the valid columns only.
    let mut buf = [0.0f32; MR * NR];
    for r in 0..R {
        for q in 0..3 {
            _mm512_storeu_ps(buf.as_mut_ptr().add(r * NR + 16 * q), acc[r][q]);
        }
    }
    for r in 0..R {
        let y = &mut buf[r * NR..r * NR + t.cols];
        activate_row(y, t.act);
        std::ptr::copy_nonoverlapping(y.as_ptr(), t.c.add(r * t.ldc), t.cols);
    }
}
