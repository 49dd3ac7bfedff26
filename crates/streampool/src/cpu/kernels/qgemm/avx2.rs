//! The AVX2 microkernel: 6 rows by 16 columns, 12 `ymm` accumulators of `i32`. Each step
//! loads one step of the packed panel (two `k` of 16 columns, two vectors), broadcasts the
//! matching pair of `i16` of each activation row as one `i32`, and `vpmaddwd` multiplies and
//! sums each pair into an `i32` lane: exact, no saturation (see the module docs).

use std::arch::x86_64::*;

use super::{scales_of, Tile, GROUP, NR};

/// Rows of the register tile.
pub(super) const MR: usize = 6;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// `R` rows of one tile (see [`Tile`]).
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `R` rows as [`Tile`] says.
// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn tile<const R: usize>(t: &Tile) {
    // The running f32 sums live in memory (12 more registers than AVX2 has), touched once
    // per group; the i32 sums of the group in registers.
    let mut sum = [[_mm256_setzero_ps(); 2]; R];
    let rows: [*const i32; R] = std::array::from_fn(|r| t.a.add(r * t.lda) as *const i32);
    let mut w = t.w as *const __m256i;
    for g in 0..t.groups {
        let s0 = g * GROUP / 2;
        let s1 = (s0 + GROUP / 2).min(t.steps);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for s in s0..s1 {
            // Panels are 64-byte aligned steps (`Step`): aligned loads.
            let b = [_mm256_load_si256(w), _mm256_load_si256(w.add(1))];
            for r in 0..R {
                // The pair (a[2s], a[2s + 1]) of row r in every lane.
                let x = _mm256_set1_epi32(rows[r].add(s).read_unaligned());
                for q in 0..2 {
                    acc[r][q] = _mm256_add_epi32(acc[r][q], _mm256_madd_epi16(x, b[q]));
                }
            }
            w = w.add(2);
        }
        for r in 0..R {
            // The order of `super::add_group`: sum + f32(acc) * sa.
            let sa = _mm256_set1_ps(t.a_scales.add(r * t.groups + g).read());
            for q in 0..2 {
                let part = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][q]), sa);
                sum[r][q] = _mm256_add_ps(sum[r][q], part);
            }
        }
    }
    let ws = [
        _mm256_loadu_ps(t.w_scales),
        _mm256_loadu_ps(t.w_scales.add(8)),
    ];
    let bias = [_mm256_loadu_ps(t.bias), _mm256_loadu_ps(t.bias.add(8))];
    let mut buf = [0.0f32; MR * NR];
    let direct = t.cols == NR;
    for r in 0..R {
        for q in 0..2 {
            // The order of `super::dequantize`: sum * sw + bias, each rounded once.
            let y = _mm256_add_ps(_mm256_mul_ps(sum[r][q], ws[q]), bias[q]);
            let dst = if direct {
                t.c.add(r * t.ldc + 8 * q)
            } else {
                buf.as_mut_ptr().add(r * NR + 8 * q)
            };
            _mm256_storeu_ps(dst, y);
        }
    }
    for r in 0..R {
        let y = if direct {
            std::slice::from_raw_parts_mut(t.c.add(r * t.ldc), NR)
        } else {
            &mut buf[r * NR..r * NR + t.cols]
        };
        super::super::sgemm::activate_row(y, t.act);
        if !direct {
            std::ptr::copy_nonoverlapping(y.as_ptr(), t.c.add(r * t.ldc), t.cols);
        }
    }
}

/// Quantizes one contiguous group of activations into `out` (as long as `x`): returns its
/// scale and whether every value was finite (else `out` is zeros). The same values as
/// [`super::scalar::quantize_group`] (`vcvtps2dq` rounds to nearest even under the default
/// rounding mode, as `round_ties_even`).
///
/// # Safety
/// [`available`] holds.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_group(x: &[f32], out: &mut [i16]) -> (f32, bool) {
    let k = x.len();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
    let mut vmax = _mm256_setzero_ps();
    // Any NaN or infinity makes some `x - x` a NaN; NaN sticks through the adds.
    let mut vnan = _mm256_setzero_ps();
    let chunks = k / 8;
    for c in 0..chunks {
        let v = _mm256_loadu_ps(x.as_ptr().add(8 * c));
        vmax = _mm256_max_ps(vmax, _mm256_and_ps(v, abs_mask));
        vnan = _mm256_add_ps(vnan, _mm256_sub_ps(v, v));
    }
    let mut lanes = [0.0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), vmax);
    let mut amax = lanes.iter().fold(0.0f32, |m, &v| m.max(v));
    _mm256_storeu_ps(lanes.as_mut_ptr(), vnan);
    let mut finite = lanes.iter().all(|v| *v == 0.0);
    for &v in &x[chunks * 8..] {
        finite &= v.is_finite();
        amax = amax.max(v.abs());
    }
    if !finite {
        out.fill(0);
        return (f32::NAN, false);
    }
    let (scale, inv) = scales_of(amax);
    let vinv = _mm256_set1_ps(inv);
    let (lo, hi) = (_mm256_set1_epi32(-127), _mm256_set1_epi32(127));
    for c in 0..chunks {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * c)), vinv);
        let q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);
        // Eight i32 in [-127, 127] to eight i16: pack the two halves (no saturation hits).
        let packed = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storeu_si128(out.as_mut_ptr().add(8 * c) as *mut __m128i, packed);
    }
    for p in chunks * 8..k {
        out[p] = super::quantize_value(x[p], inv);
    }
    (scale, true)
}
