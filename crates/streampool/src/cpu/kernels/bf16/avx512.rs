//! The AVX512_BF16 kernel: `vdpbf16ps` over 32 rows (two packed panels, 16 `f32` lanes
//! each) by 12 output columns, 24 accumulators in registers; each step loads one `k` pair
//! of both panels and broadcasts one pair of each of the 12 weight columns, which
//! [`super::pack_b`] put in 48 consecutive bytes (12 row pointers into an unpacked weight
//! spilled general registers, at half the speed).

use std::arch::x86_64::*;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::{store_tile, target_tasks, Epilogue, Packed};

/// Output columns per register block.
pub(super) const NR: usize = 12;

pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// `c[m, n] = act(a @ b + bias)` in `bf16` (`f32` until the rounding), `a` packed in `p`,
/// `b` in `w` by [`super::pack_b`] with blocks of [`NR`].
///
/// # Safety
/// [`available`] holds; `w` holds `n.div_ceil(NR) * p.kp * NR` words; `p` is valid as
/// [`Packed`] describes with at least `m` rows; `c` is valid for `m * n` `bf16` writes and
/// owned by this call; `epi.bias` holds `n` values.
pub(super) unsafe fn product(
    p: &Packed,
    w: &[u32],
    c: DevicePtr,
    m: usize,
    n: usize,
    epi: &Epilogue,
) {
    let mblocks = m.div_ceil(32);
    // Column chunks (whole register blocks) so that there are about target_tasks() tasks.
    let per_m = target_tasks().div_ceil(mblocks).max(1);
    let nc = n.div_ceil(per_m).next_multiple_of(NR).max(NR);
    let nchunks = n.div_ceil(nc);
    let kp = p.kp;
    let pw = DevicePtr(w.as_ptr() as u64);
    intra_op::for_ranges(mblocks * nchunks, 32 * nc * kp * 2, |r| {
        for t in r {
            let (mb, nb) = (t / nchunks, t % nchunks);
            let rows = (m - mb * 32).min(32);
            let panels = rows.div_ceil(16);
            let pa = (p.ptr.0 as *const u16).add(mb * 2 * kp * 32);
            let mut j = nb * nc;
            let end = ((nb + 1) * nc).min(n);
            while j < end {
                let cols = (end - j).min(NR);
                let wj = (pw.0 as *const u32).add(j / NR * kp * NR);
                let cj = (c.0 as *mut u16).add(mb * 32 * n + j);
                // SAFETY: the task owns rows mb*32.. of c; the column block lies inside n and
                // the panels inside p (both checked above); available() holds.
                match (panels, cols) {
                    (2, 9..) => block::<2, NR>(pa, kp, wj, cj, n, rows, cols, epi, j),
                    (1, 9..) => block::<1, NR>(pa, kp, wj, cj, n, rows, cols, epi, j),
                    (2, 5..) => block::<2, 8>(pa, kp, wj, cj, n, rows, cols, epi, j),
                    (1, 5..) => block::<1, 8>(pa, kp, wj, cj, n, rows, cols, epi, j),
                    (2, _) => block::<2, 4>(pa, kp, wj, cj, n, rows, cols, epi, j),
                    _ => block::<1, 4>(pa, kp, wj, cj, n, rows, cols, epi, j),
                }
                j += cols;
            }
        }
    });
}

/// One register block: `MP` panels by `cols <= C` columns (the packed block's words past
/// `cols` repeat the last row; their sums are dropped).
///
/// # Safety
/// `pa` holds `MP` panels of `kp` pairs; `w` holds one packed block of `kp * NR` words;
/// `c` is valid for `rows <= 16 * MP` rows of `cols` `bf16` at stride `ldc`; `epi`'s bias
/// holds columns `j0..j0 + cols`.
// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn block<const MP: usize, const C: usize>(
    pa: *const u16,
    kp: usize,
    w: *const u32,
    c: *mut u16,
    ldc: usize,
    rows: usize,
    cols: usize,
    epi: &Epilogue,
    j0: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); C]; MP];
    for s in 0..kp {
        let mut av = [_mm512_setzero_si512(); MP];
        for (q, v) in av.iter_mut().enumerate() {
            *v = _mm512_loadu_si512(pa.add((q * kp + s) * 32) as *const __m512i);
        }
        let ws = w.add(s * NR);
        for j in 0..C {
            let bv = _mm512_set1_epi32(ws.add(j).read() as i32);
            for q in 0..MP {
                acc[q][j] = _mm512_dpbf16_ps(
                    acc[q][j],
                    std::mem::transmute::<__m512i, __m512bh>(av[q]),
                    std::mem::transmute::<__m512i, __m512bh>(bv),
                );
            }
        }
    }
    // tile[j * 32 + i]: column j, row i.
    let mut tile = [0.0f32; 32 * NR];
    for j in 0..C {
        for q in 0..MP {
            _mm512_storeu_ps(tile.as_mut_ptr().add(j * 32 + q * 16), acc[q][j]);
        }
    }
    store_tile(&tile, (1, 32), rows, cols, c, ldc, epi, j0);
}
