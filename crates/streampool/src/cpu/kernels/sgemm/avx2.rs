//! The AVX2 + FMA microkernel: 6 rows by 16 columns, 12 `ymm` accumulators; each step loads
//! one row of the packed panel (two vectors) and broadcasts one element of each row of `a`.

use std::arch::x86_64::*;

use super::{activate_row, Tile};
use crate::kernel::Activation;

/// Rows of the register tile.
pub(super) const MR: usize = 6;
/// Columns of the register tile: a packed panel's width.
pub(super) const NR: usize = 16;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// `R` rows of one tile (see [`Tile`]).
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `R` rows as [`Tile`] says.
// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile) {
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
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
            for q in 0..2 {
                acc[r][q] = _mm256_loadu_ps(src.add(r * ld + 8 * q));
            }
        }
    } else if !t.bias.is_null() {
        let v = [_mm256_loadu_ps(t.bias), _mm256_loadu_ps(t.bias.add(8))];
        acc = [v; R];
    }
    let rows: [*const f32; R] = std::array::from_fn(|r| t.a.add(r * t.rs));
    let mut w = t.w;
    for p in 0..t.k {
        let b = [_mm256_loadu_ps(w), _mm256_loadu_ps(w.add(8))];
        let off = p * t.cs;
        for r in 0..R {
            let x = _mm256_set1_ps(rows[r].add(off).read());
            for q in 0..2 {
                acc[r][q] = _mm256_fmadd_ps(x, b[q], acc[r][q]);
            }
        }
        w = w.add(NR);
    }
    // Every accumulator is stored in small loops of its own (fully unrolled: an index
    // into `acc` that stays a variable would put the whole grid in memory, and the loop
    // above would then store it on every step, as the first version did).
    if t.cols == NR {
        for r in 0..R {
            for q in 0..2 {
                _mm256_storeu_ps(t.c.add(r * t.ldc + 8 * q), acc[r][q]);
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
        for q in 0..2 {
            _mm256_storeu_ps(buf.as_mut_ptr().add(r * NR + 8 * q), acc[r][q]);
        }
    }
    for r in 0..R {
        let y = &mut buf[r * NR..r * NR + t.cols];
        activate_row(y, t.act);
        std::ptr::copy_nonoverlapping(y.as_ptr(), t.c.add(r * t.ldc), t.cols);
    }
}
