//! One (sequence, head) pair of `f32` attention in AVX-512 registers, for head widths that
//! are a multiple of 16 (MiniLM's 32, BERT-base's 64).
//!
//! At MiniLM's shapes a pair is tiny (32 queries, 32 keys, width 32 at 32 tokens): the
//! `gemm` crate's dispatch and packing per call, and a softmax whose masked maximum and
//! `exp` LLVM left scalar, cost more than the arithmetic (on the dev VM, one thread: 37% of
//! attention's time in the softmax, 46% in `gemm`). Here every step is in registers:
//!
//! 1. the keys are transposed into the task's scratch (`kt`: `[d][sp]`, `sp` the sequence
//!    rounded up to 16, zero past it) with gathers, 16 keys of one column per gather;
//! 2. scores `q k^T` in tiles of up to 8 queries by 32 keys ([`tile`]: 16 accumulators,
//!    each step two loads of `kt`, eight broadcasts of `q` and 16 FMAs), into `s` (`[seq][sp]`);
//! 3. a masked softmax per row (padding keys exactly 0; the sum in `f64` as the reference
//!    loops take it);
//! 4. the output `p v` in tiles of up to 8 queries by 32 output columns, written straight
//!    into the output rows, the values read in place from the QKV rows.
//!
//! Bounds: the scratch is `d * sp + seq * sp` floats per task, so [`applies`] keeps
//! sequences up to [`MAX_SEQ`] here (4 MiB of scores at most); longer ones take the `gemm` path.

use std::arch::x86_64::*;

/// The longest sequence this path takes (its score block is `seq x seq`, in the task's
/// scratch).
pub(super) const MAX_SEQ: usize = 1024;

/// Whether this host has the instructions of this path.
pub(super) fn host_has() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")
}

/// Whether pairs of these shapes take this path (on a host that [`host_has`] it).
pub(super) fn applies(seq: usize, d: usize) -> bool {
    d.is_multiple_of(16) && d > 0 && seq <= MAX_SEQ && host_has()
}

/// The scratch one pool task needs for pairs of this shape: (`kt`, `s`) lengths.
pub(super) fn scratch_len(seq: usize, d: usize) -> (usize, usize) {
    let sp = seq.next_multiple_of(16);
    (d * sp, seq * sp)
}

/// One pair's operands: queries, keys and values (`seq` rows `width` floats apart, `d`
/// columns each), the output (`seq` rows `ldo` apart), and the keys to keep (`keep[j]` 1 or
/// 0 for `j < seq`; `None`: all).
pub(super) struct Pair<'a> {
    pub(super) q: *const f32,
    pub(super) k: *const f32,
    pub(super) v: *const f32,
    pub(super) width: usize,
    pub(super) out: *mut f32,
    pub(super) ldo: usize,
    pub(super) seq: usize,
    pub(super) d: usize,
    pub(super) keep: Option<&'a [f32]>,
}

/// Computes one pair (see the module docs).
///
/// # Safety
/// [`applies`] holds for `p.seq`, `p.d`; the pointers are valid for `p.seq` rows as [`Pair`]
/// says; `kt` and `s` are at least [`scratch_len`] long; the output overlaps no input.
#[target_feature(enable = "avx512f,fma")]
pub(super) unsafe fn pair(p: &Pair, kt: &mut [f32], s: &mut [f32]) {
    let (seq, d) = (p.seq, p.d);
    let sp = seq.next_multiple_of(16);
    let (kt, s) = (kt.as_mut_ptr(), s.as_mut_ptr());
    // 1. kt[c][j] = k[j][c], in 16 x 16 blocks transposed in registers (keys past seq read
    // as zero rows). Gathers were the first version: on this path's hosts a gather costs
    // about as much as its 16 loads and stores done one by one.
    for jb in (0..sp).step_by(16) {
        let keys = (seq - jb).min(16);
        for cb in (0..d).step_by(16) {
            let mut r = [_mm512_setzero_ps(); 16];
            for (j, row) in r.iter_mut().enumerate().take(keys) {
                *row = _mm512_loadu_ps(p.k.add((jb + j) * p.width + cb));
            }
            transpose16(&mut r);
            for (c, col) in r.iter().enumerate() {
                _mm512_storeu_ps(kt.add((cb + c) * sp + jb), *col);
            }
        }
    }
    // 2. s[i][j] = q_i . k_j for j < sp (zero keys past seq give zero scores, unused).
    let mut i = 0;
    while i < seq {
        let rows = (seq - i).min(8);
        let mut j = 0;
        while j < sp {
            let wide = sp - j >= 32;
            tiles(
                rows,
                wide,
                d,
                (p.q.add(i * p.width), p.width),
                (kt.add(j), sp),
                (s.add(i * sp + j), sp),
            );
            j += if wide { 32 } else { 16 };
        }
        i += rows;
    }
    // 3. The softmax of each row over its first seq entries.
    for i in 0..seq {
        softmax_row(s.add(i * sp), seq, p.keep);
    }
    // 4. out[i][c] = sum_j p[i][j] v[j][c], in column groups of 32 (then 16).
    let mut i = 0;
    while i < seq {
        let rows = (seq - i).min(8);
        let mut c = 0;
        while c < d {
            let wide = d - c >= 32;
            tiles(
                rows,
                wide,
                seq,
                (s.add(i * sp), sp),
                (p.v.add(c), p.width),
                (p.out.add(i * p.ldo + c), p.ldo),
            );
            c += if wide { 32 } else { 16 };
        }
        i += rows;
    }
}

/// Transposes the 16 x 16 block whose rows are `r` (the unpack / 128-bit shuffle network:
/// 32-bit pairs, then 64-bit pairs, then 128-bit lanes twice).
#[inline]
#[target_feature(enable = "avx512f")]
fn transpose16(r: &mut [__m512; 16]) {
    let mut t = [_mm512_setzero_ps(); 16];
    for i in 0..8 {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    let (lo, hi) = (
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
        |a: __m512, b: __m512| {
            _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)))
        },
    );
    for g in 0..4 {
        let b = 4 * g;
        r[b] = lo(t[b], t[b + 2]);
        r[b + 1] = hi(t[b], t[b + 2]);
        r[b + 2] = lo(t[b + 1], t[b + 3]);
        r[b + 3] = hi(t[b + 1], t[b + 3]);
    }
    for h in 0..2 {
        let b = 8 * h;
        for i in 0..4 {
            t[b + i] = _mm512_shuffle_f32x4::<0x88>(r[b + i], r[b + 4 + i]);
            t[b + 4 + i] = _mm512_shuffle_f32x4::<0xdd>(r[b + i], r[b + 4 + i]);
        }
    }
    for i in 0..8 {
        r[i] = _mm512_shuffle_f32x4::<0x88>(t[i], t[8 + i]);
        r[8 + i] = _mm512_shuffle_f32x4::<0xdd>(t[i], t[8 + i]);
    }
}

/// [`tile`] for `rows` (1 to 8) rows and 32 (`wide`) or 16 columns.
///
/// # Safety
/// As [`tile`].
#[target_feature(enable = "avx512f,fma")]
unsafe fn tiles(
    rows: usize,
    wide: bool,
    k: usize,
    a: (*const f32, usize),
    b: (*const f32, usize),
    c: (*mut f32, usize),
) {
    macro_rules! go {
        ($($r:literal)*) => {
            match (rows, wide) {
                $(($r, true) => tile::<$r, 2>(k, a, b, c),
                  ($r, false) => tile::<$r, 1>(k, a, b, c),)*
                _ => unreachable!("a tile has 1 to 8 rows"),
            }
        };
    }
    go!(1 2 3 4 5 6 7 8)
}

/// `c[r][16 n + l] = sum_p a[r][p] * b[p][16 n + l]` for `r < R`, `n < N`, `l < 16`, with
/// `a` rows `a.1` apart (elements contiguous), `b` and `c` rows `b.1`, `c.1` apart; `c` is
/// overwritten.
///
/// # Safety
/// `a` valid for `R` rows of `k`, `b` for `k` rows of `16 N`, `c` for `R` rows of `16 N`
/// floats; `c` overlaps neither.
// Index loops over the accumulator grid: with const bounds they unroll into registers.
#[allow(clippy::needless_range_loop)]
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile<const R: usize, const N: usize>(
    k: usize,
    (a, lda): (*const f32, usize),
    (b, ldb): (*const f32, usize),
    (c, ldc): (*mut f32, usize),
) {
    let mut acc = [[_mm512_setzero_ps(); N]; R];
    for p in 0..k {
        let bp = b.add(p * ldb);
        let bv: [__m512; N] = std::array::from_fn(|n| _mm512_loadu_ps(bp.add(16 * n)));
        for r in 0..R {
            let x = _mm512_set1_ps(a.add(r * lda + p).read());
            for n in 0..N {
                acc[r][n] = _mm512_fmadd_ps(x, bv[n], acc[r][n]);
            }
        }
    }
    for r in 0..R {
        for n in 0..N {
            _mm512_storeu_ps(c.add(r * ldc + 16 * n), acc[r][n]);
        }
    }
}

/// Softmax in place of `row[..seq]` over the keys kept (`keep[j] != 0`, all when `None`);
/// the others get exactly 0. When no key is kept every key gets `1 / seq` (a uniform row, as
/// Hugging Face's additive `f32::MIN` mask gives).
///
/// # Safety
/// `row` is valid for `seq` floats (and up to the next multiple of 16: the scratch row);
/// `keep`, if given, has `seq` entries.
#[target_feature(enable = "avx512f,fma")]
unsafe fn softmax_row(row: *mut f32, seq: usize, keep: Option<&[f32]>) {
    let mut any = false;
    let mut mx = _mm512_set1_ps(f32::NEG_INFINITY);
    for jb in (0..seq).step_by(16) {
        let m = kept(jb, seq, keep);
        any |= m != 0;
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_loadu_ps(row.add(jb)));
    }
    if !any {
        let u = _mm512_set1_ps(1.0 / seq as f32);
        for jb in (0..seq).step_by(16) {
            let valid = if seq - jb >= 16 {
                0xffff
            } else {
                (1u16 << (seq - jb)) - 1
            };
            _mm512_mask_storeu_ps(row.add(jb), valid, u);
        }
        return;
    }
    let mx = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
    // Two f64 sums (the low and high halves of each block): half the chain of dependent adds.
    let (mut sum, mut sum_hi) = (_mm512_setzero_pd(), _mm512_setzero_pd());
    for jb in (0..seq).step_by(16) {
        let m = kept(jb, seq, keep);
        // exp of every lane (finite: x - max <= 0 for kept lanes, clamped otherwise), zero
        // where not kept; lanes past seq are stored as zero in the scratch row.
        let e = _mm512_maskz_mov_ps(m, exp(_mm512_sub_ps(_mm512_loadu_ps(row.add(jb)), mx)));
        _mm512_storeu_ps(row.add(jb), e);
        sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        sum_hi = _mm512_add_pd(
            sum_hi,
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(e),
            ))),
        );
    }
    let inv = _mm512_set1_ps((1.0 / _mm512_reduce_add_pd(_mm512_add_pd(sum, sum_hi))) as f32);
    for jb in (0..seq).step_by(16) {
        let x = _mm512_loadu_ps(row.add(jb));
        _mm512_storeu_ps(row.add(jb), _mm512_mul_ps(x, inv));
    }
}

/// The lanes of block `jb` (16 keys from `jb`) that are keys (`< seq`) and kept (`keep[j]`
/// not 0; a NaN counts as kept, as in the `gemm` path).
///
/// # Safety
/// `keep`, if given, has `seq` entries.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn kept(jb: usize, seq: usize, keep: Option<&[f32]>) -> __mmask16 {
    let valid: __mmask16 = if seq - jb >= 16 {
        0xffff
    } else {
        (1u16 << (seq - jb)) - 1
    };
    match keep {
        Some(keep) => {
            let kv = _mm512_maskz_loadu_ps(valid, keep.as_ptr().add(jb));
            _mm512_mask_cmp_ps_mask::<_CMP_NEQ_UQ>(valid, kv, _mm512_setzero_ps())
        }
        None => valid,
    }
}

/// `e^x` lane by lane: the same range reduction and polynomial as
/// [`super::super::simd::exp`] (Cephes' `expf`, within 2 ulp), with the power of two put in
/// by `vscalefps`; below -87.3 gives 0.
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn exp(x: __m512) -> __m512 {
    let underflow = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(-87.3));
    let x = _mm512_min_ps(
        _mm512_max_ps(x, _mm512_set1_ps(-87.3)),
        _mm512_set1_ps(88.3),
    );
    let n = _mm512_roundscale_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
        _mm512_mul_ps(x, _mm512_set1_ps(std::f32::consts::LOG2_E)),
    );
    // r = x - n ln2, ln 2 in two parts so that n * C1 is exact.
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693_359_4), x);
    let r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.121_944_4e-4), r);
    let mut q = _mm512_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        1.666_666_5e-1,
        0.5,
    ] {
        q = _mm512_fmadd_ps(q, r, _mm512_set1_ps(c));
    }
    // e = q r^2 + r + 1
    let e = _mm512_fmadd_ps(
        _mm512_mul_ps(q, r),
        r,
        _mm512_add_ps(r, _mm512_set1_ps(1.0)),
    );
    _mm512_maskz_mov_ps(!underflow, _mm512_scalef_ps(e, n))
}
