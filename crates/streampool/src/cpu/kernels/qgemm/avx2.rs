//! The 256-bit microkernels: 3 rows by 16 columns, 6 `ymm` accumulators of `i32` and 6 of
//! running `f32` sums, all in registers (with 6 rows the 12 sums lived in memory and every
//! group's epilogue loaded and stored them: in a profile of MiniLM's forward, 3 rows took the
//! int8 products from 1.35x to 1.57x the f32 ones on a Zen 3, though each panel step now
//! serves 3 rows instead of 6). Each step
//! loads one step of the packed panel (four `k` of 16 columns, two vectors) and broadcasts
//! the matching four `u8` of each activation row as one `i32`. On AVX2, `vpmaddubsw`
//! multiplies the bytes and adds adjacent pairs into `i16` (exact: the weights are small
//! enough that no pair saturates, see the module docs), `vpmaddwd` by ones adds those pairs
//! into `i32` and `vpaddd` accumulates; with AVX-VNNI, `vpdpbusd` does the three at once and
//! computes the same integers.

use std::arch::x86_64::*;

use super::pack::KSTEP;
use super::{quantize_value, scales_of, Tile, A_MAX, A_ZERO, GROUP, NR};

/// Rows of the register tile.
pub(super) const MR: usize = 3;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx2")
}

/// AVX2 with the 256-bit VNNI instructions (Alder Lake, Sapphire Rapids, Zen 5 and later).
pub(super) fn vnni_available() -> bool {
    available() && is_x86_feature_detected!("avxvnni")
}

/// Adds the four-byte dot products of `x` (`u8`) and `w` (`i8`) to each `i32` lane of `acc`.
macro_rules! madd {
    (avx2, $acc:expr, $x:expr, $w:expr, $ones:expr) => {
        _mm256_add_epi32($acc, _mm256_madd_epi16(_mm256_maddubs_epi16($x, $w), $ones))
    };
    (vnni, $acc:expr, $x:expr, $w:expr, $ones:expr) => {{
        let _ = $ones; // only the AVX2 form needs it
        _mm256_dpbusd_avx_epi32($acc, $x, $w)
    }};
}

/// One tile of `$R` rows (see [`Tile`]) with the products of [`madd`]`!($kind, ..)`.
macro_rules! tile_body {
    ($kind:ident, $R:ident, $t:expr) => {{
        let t: &Tile = $t;
        let ones = _mm256_set1_epi16(1);
        // The running f32 sums and the group's i32 sums: 12 registers; the two weight
        // vectors, the broadcast and a product take the other 4 (the ones come from memory).
        let mut sum = [[_mm256_setzero_ps(); 2]; $R];
        let rows: [*const i32; $R] = std::array::from_fn(|r| t.a.add(r * t.lda) as *const i32);
        let mut w = t.w as *const __m256i;
        for g in 0..t.groups {
            let s0 = g * GROUP / KSTEP;
            let s1 = (s0 + GROUP / KSTEP).min(t.steps);
            // Each group's sums start from its corrections (a 64-byte aligned `GroupInfo`).
            let info = &*t.info.add(g);
            let corr = info.correction.as_ptr() as *const __m256i;
            let init = [_mm256_load_si256(corr), _mm256_load_si256(corr.add(1))];
            let mut acc = [init; $R];
            for s in s0..s1 {
                // Panels are 64-byte aligned steps (`Step`): aligned loads.
                let b = [_mm256_load_si256(w), _mm256_load_si256(w.add(1))];
                for r in 0..$R {
                    // The four bytes a[4s..4s + 4] of row r in every lane.
                    let x = _mm256_set1_epi32(rows[r].add(s).read_unaligned());
                    for q in 0..2 {
                        acc[r][q] = madd!($kind, acc[r][q], x, b[q], ones);
                    }
                }
                w = w.add(2);
            }
            let sw = [
                _mm256_load_ps(info.scale.as_ptr()),
                _mm256_load_ps(info.scale.as_ptr().add(8)),
            ];
            for r in 0..$R {
                // The order of `super::add_group`: sum + f32(acc) * (sa * sw).
                let sa = _mm256_set1_ps(t.a_scales.add(r * t.groups + g).read());
                for q in 0..2 {
                    let s = _mm256_mul_ps(sa, sw[q]);
                    let part = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[r][q]), s);
                    sum[r][q] = _mm256_add_ps(sum[r][q], part);
                }
            }
        }
        store::<$R>(&sum, t);
    }};
}

/// `rows` rows of one tile on AVX2.
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `rows` (at most [`MR`]) rows as
/// [`Tile`] says.
pub(super) unsafe fn tile(rows: usize, t: &Tile) {
    match rows {
        3 => tile_avx2::<3>(t),
        2 => tile_avx2::<2>(t),
        _ => tile_avx2::<1>(t),
    }
}

/// `rows` rows of one tile on AVX-VNNI.
///
/// # Safety
/// [`vnni_available`] holds; `t`'s pointers are valid for `rows` (at most [`MR`]) rows as
/// [`Tile`] says.
pub(super) unsafe fn tile_vnni(rows: usize, t: &Tile) {
    match rows {
        3 => tile_avxvnni::<3>(t),
        2 => tile_avxvnni::<2>(t),
        _ => tile_avxvnni::<1>(t),
    }
}

// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2")]
unsafe fn tile_avx2<const R: usize>(t: &Tile) {
    tile_body!(avx2, R, t)
}

#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx2,avxvnni")]
unsafe fn tile_avxvnni<const R: usize>(t: &Tile) {
    tile_body!(vnni, R, t)
}

/// The epilogue of `R` rows: `act(sum + bias)` into `t.c`.
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `R` rows as [`Tile`] says.
#[target_feature(enable = "avx2")]
unsafe fn store<const R: usize>(sum: &[[__m256; 2]; R], t: &Tile) {
    let bias = [_mm256_loadu_ps(t.bias), _mm256_loadu_ps(t.bias.add(8))];
    let mut buf = [0.0f32; MR * NR];
    let direct = t.cols == NR;
    for (r, sum) in sum.iter().enumerate() {
        for q in 0..2 {
            let y = _mm256_add_ps(sum[q], bias[q]);
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

/// Quantizes one contiguous group of activations into `out` (as long as `x`) as `qa +
/// A_ZERO`: returns its scale and whether every value was finite (else `out` holds
/// `A_ZERO`). The same values as [`super::pack::quantize_group`] (`vcvtps2dq` rounds to
/// nearest even under the default rounding mode, as `round_ties_even`).
///
/// # Safety
/// [`available`] holds.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_group(x: &[f32], out: &mut [u8]) -> (f32, bool) {
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
        out.fill(A_ZERO as u8);
        return (f32::NAN, false);
    }
    let (scale, inv) = scales_of(amax, A_MAX);
    let vinv = _mm256_set1_ps(inv);
    let (lo, hi) = (
        _mm256_set1_epi32(-(A_MAX as i32)),
        _mm256_set1_epi32(A_MAX as i32),
    );
    let zero = _mm256_set1_epi32(A_ZERO);
    for c in 0..chunks {
        let v = _mm256_mul_ps(_mm256_loadu_ps(x.as_ptr().add(8 * c)), vinv);
        let q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);
        let q = _mm256_add_epi32(q, zero);
        // Eight i32 in [0, 255] to eight u8: pack the halves to i16, then to u8 (no
        // saturation hits), and store the low eight bytes.
        let w = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        let b = _mm_packus_epi16(w, w);
        _mm_storel_epi64(out.as_mut_ptr().add(8 * c) as *mut __m128i, b);
    }
    for p in chunks * 8..k {
        out[p] = (quantize_value(x[p], inv, A_MAX) + A_ZERO) as u8;
    }
    (scale, true)
}
