//! The AVX-512 VNNI microkernel: 12 rows by 16 columns, one `zmm` of `i32` per row. Each step
//! loads one step of the packed panel (four `k` of 16 columns: one vector) and, per row,
//! broadcasts the matching four `u8` as one `i32`; `vpdpbusd` multiplies the bytes and adds
//! each four products into the row's `i32` lanes, exactly (the same integers as the other
//! paths). The running `f32` sums stay in registers too (24 of the 32).

use std::arch::x86_64::*;

use super::pack::KSTEP;
use super::{Tile, GROUP, NR};

/// Rows of the register tile.
pub(super) const MR: usize = 12;

/// AVX-512 with byte/word operations and VNNI (Ice Lake, Sapphire Rapids, Zen 4 and later);
/// AVX2 for the activations' quantization.
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f")
        && is_x86_feature_detected!("avx512bw")
        && is_x86_feature_detected!("avx512vnni")
        && super::avx2::available()
}

/// `rows` rows of one tile.
///
/// # Safety
/// [`available`] holds; `t`'s pointers are valid for `rows` (at most [`MR`]) rows as
/// [`Tile`] says.
pub(super) unsafe fn tile(rows: usize, t: &Tile) {
    match rows {
        12 => tile_r::<12>(t),
        11 => tile_r::<11>(t),
        10 => tile_r::<10>(t),
        9 => tile_r::<9>(t),
        8 => tile_r::<8>(t),
        7 => tile_r::<7>(t),
        6 => tile_r::<6>(t),
        5 => tile_r::<5>(t),
        4 => tile_r::<4>(t),
        3 => tile_r::<3>(t),
        2 => tile_r::<2>(t),
        _ => tile_r::<1>(t),
    }
}

// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_r<const R: usize>(t: &Tile) {
    let mut sum = [_mm512_setzero_ps(); R];
    let rows: [*const i32; R] = std::array::from_fn(|r| t.a.add(r * t.lda) as *const i32);
    let mut w = t.w as *const __m512i;
    for g in 0..t.groups {
        let s0 = g * GROUP / KSTEP;
        let s1 = (s0 + GROUP / KSTEP).min(t.steps);
        // Each group's sums start from its corrections (a 64-byte aligned `GroupInfo`).
        let info = &*t.info.add(g);
        let init = _mm512_load_si512(info.correction.as_ptr() as *const __m512i);
        let mut acc = [init; R];
        for s in s0..s1 {
            // Panels are 64-byte aligned steps (`Step`): aligned loads.
            let b = _mm512_load_si512(w);
            for r in 0..R {
                // The four bytes a[4s..4s + 4] of row r in every lane.
                let x = _mm512_set1_epi32(rows[r].add(s).read_unaligned());
                acc[r] = _mm512_dpbusd_epi32(acc[r], x, b);
            }
            w = w.add(1);
        }
        let sw = _mm512_load_ps(info.scale.as_ptr());
        for r in 0..R {
            // The order of `super::add_group`: sum + f32(acc) * (sa * sw).
            let s = _mm512_mul_ps(_mm512_set1_ps(t.a_scales.add(r * t.groups + g).read()), sw);
            sum[r] = _mm512_add_ps(sum[r], _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r]), s));
        }
    }
    let bias = _mm512_loadu_ps(t.bias);
    // Columns past `cols` are neither written nor activated.
    let mask: __mmask16 = if t.cols >= NR {
        !0
    } else {
        (1u16 << t.cols) - 1
    };
    for r in 0..R {
        let y = _mm512_add_ps(sum[r], bias);
        let dst = t.c.add(r * t.ldc);
        _mm512_mask_storeu_ps(dst, mask, y);
        super::super::sgemm::activate_row(std::slice::from_raw_parts_mut(dst, t.cols), t.act);
    }
}
