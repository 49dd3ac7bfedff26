//! Int8 products ([`MatmulMath::Int8`](crate::MatmulMath::Int8)): `f32` operands quantized
//! to 8-bit integers, multiplied with exact integer sums and scaled back to `f32`.
//!
//! What is computed, exactly (the tests check it against `f64`):
//!
//! - **Weights** (`b`, `[k, n]`), per output column `j` and group `g` of [`GROUP`]
//!   consecutive inputs, once: `sw[g, j] = max_{p in g} |b[p, j]| / W_MAX` and `qb[p, j] =
//!   clamp(round_even(b[p, j] * (W_MAX / max_{p in g} |b[p, j]|)), -W_MAX, W_MAX)` with
//!   [`W_MAX`] = 64 (zeros, scale 0, for a zero group). Kept in the weight's [`PackSlot`],
//!   packed for the microkernels, by the first product that uses it.
//! - **Activations** (`a`, `[m, k]`), per row `i` and group `g`, on every call: `sa[i, g] =
//!   max_{p in g} |a[i, p]| / A_MAX` and `qa[i, p]` likewise in `[-A_MAX, A_MAX]`, [`A_MAX`]
//!   = 127; a row holding a NaN or an infinity gets NaN scales, so its outputs are NaN as
//!   they would be in `f32`.
//! - **Product**: per group, `acc[i, g, j] = sum_{p in g} qa[i, p] * qb[p, j]` in `i32`,
//!   exact; then `s[i, j] = sum_g f32(acc[i, g, j]) * (sa[i, g] * sw[g, j])` in `f32`, group
//!   by group in order, each product and sum rounded once.
//! - **Epilogue**: `out[i, j] = act(s[i, j] + bias[j])`, rounded once in `f32`, the
//!   activation as the `f32` products apply it.
//!
//! Why groups: a transformer's activations have a few channels far larger than the rest
//! (BERT's "outlier dimensions"); one scale per token spends the 8 bits on those, and
//! all-MiniLM-L6-v2 with per-token scales missed the accuracy gate (mean cosine 0.9972 to its
//! f32). A scale per 32 inputs confines an outlier to its own group, at the cost of one
//! convert and multiply-add per accumulator per group (activations are quantized in blocks
//! of 32 in llama.cpp's `Q8` formats for the same reason).
//!
//! Why weights within 64, and a scale per group for them too: the x86 8-bit products
//! multiply an unsigned byte by a signed one. The activations are stored offset to `u8`
//! (`qa + A_ZERO`, [`A_ZERO`] = 128, so in `[1, 255]`), and each group's integer sum starts
//! from the correction `-A_ZERO * sum_{p in g} qb[p, j]` (computed once, with the packed
//! weight), which takes the offset back out exactly. AVX2's `vpmaddubsw` adds two such
//! products into an `i16` and saturates past 32,767: with weights within 64, two products
//! reach at most 2 x 255 x 64 = 32,640, so it never saturates and every path computes the
//! same integers. That buys one instruction per 32 multiply-adds (then `vpmaddwd` by ones
//! and `vpaddd` widen into `i32`), against the 16 of `vpmaddwd` on `i16` operands; VNNI's
//! `vpdpbusd` does all three in one. With one scale per column, 7-bit weights cost
//! all-MiniLM-L6-v2 the accuracy gate (mean cosine 0.99817 to its f32); one scale per
//! column and group of 32 inputs halves the weights' rounding error on most of its layers
//! (its FFN output weights have outliers that per-column scales spent bits on) and it
//! passes as the 8-bit per-column version did (`docs/quantization.md`). The group's scale
//! product `sa * sw` is one more multiply per accumulator and group.
//!
//! | path | hardware | register tile | per step of 4 `k` |
//! |---|---|---|---|
//! | [`QgemmIsa::Avx512Vnni`] | AVX-512 BW + VNNI | 12 rows x 16 columns (12 `zmm` `i32`) | one `vpdpbusd` per row |
//! | [`QgemmIsa::AvxVnni`] | AVX2 + AVX-VNNI | 3 rows x 16 columns (6 `ymm` `i32`, 6 `f32` sums) | two `vpdpbusd` per row |
//! | [`QgemmIsa::Avx2`] | AVX2 | 3 rows x 16 columns (6 `ymm` `i32`, 6 `f32` sums) | two `vpmaddubsw` + `vpmaddwd` + `vpaddd` per row |
//! | [`QgemmIsa::Scalar`] | any | one row at a time | portable loops |
//!
//! The weight is packed into panels of 16 columns, each step holding four consecutive `k`
//! of every column (`[n / 16][k / 4][16][4]` `i8`, a cache line, zero past `n` and past
//! `k`), with 16 scales and 16 corrections per panel and group: a kernel loads a step as one or two
//! vectors and broadcasts the matching four bytes of each activation row. The product is
//! split over the intra-op pool as the `f32` products are: a grid of (row block, panel)
//! units claimed by the pool's tasks, a row block sized to stay in L2 while a task walks the
//! panels.
//!
//! The packed weight (with its scales and corrections) is under a third of the size of the
//! `f32` one; it lives beside the `f32` weight it was made from (the tensor layer keeps the original). The path is chosen once per
//! process, the best the host has ([`cpu_qgemm_isa`]).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod pack;
mod scalar;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{Activation, MatOperand, PackSlot};
use pack::{
    quantize_a, quantize_b, quantize_value, scales_of, GroupInfo, Key, QuantizedA, QuantizedB,
};

/// Inputs per activation scale (a whole number of the kernels' steps of 4).
pub(crate) const GROUP: usize = 32;

/// Largest magnitude of a quantized activation.
const A_MAX: f32 = 127.0;

/// What the activations are offset by to be stored as `u8`.
const A_ZERO: i32 = 128;

/// Largest magnitude of a quantized weight.
const W_MAX: f32 = 64.0;

// Two products of a stored activation and a weight never saturate `vpmaddubsw`'s `i16`,
// and a stored activation is a `u8` (see the module docs).
const _: () = assert!(2 * (A_ZERO + A_MAX as i32) * (W_MAX as i32) <= i16::MAX as i32);
const _: () = assert!(A_ZERO - (A_MAX as i32) >= 0 && A_ZERO + (A_MAX as i32) <= 255);
const _: () = assert!(W_MAX < 128.0 && GROUP.is_multiple_of(pack::KSTEP));

/// [`MatmulMath::arithmetic`](crate::MatmulMath::arithmetic) of int8: the constants above
/// in words (a test checks they agree), and the version of the scheme.
pub(crate) const ARITHMETIC: &str =
    "int8/2: activations per 32 inputs to +-127 stored +128, weights per column and 32 inputs to +-64";

/// Columns of a weight panel (every path reads the same packing).
const NR: usize = 16;

/// Which microkernel multiplies int8 products (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QgemmIsa {
    /// 12 x 16 tiles of `vpdpbusd` in AVX-512 registers.
    Avx512Vnni,
    /// 3 x 16 tiles of 256-bit `vpdpbusd` (AVX-VNNI).
    AvxVnni,
    /// 3 x 16 tiles of `vpmaddubsw` in AVX2 registers.
    Avx2,
    /// Portable loops (any host).
    Scalar,
}

impl QgemmIsa {
    /// Every path, best first.
    pub(crate) const ALL: [QgemmIsa; 4] = [
        QgemmIsa::Avx512Vnni,
        QgemmIsa::AvxVnni,
        QgemmIsa::Avx2,
        QgemmIsa::Scalar,
    ];

    /// Whether this host can run the path.
    pub(crate) fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::Avx512Vnni => avx512::available(),
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::AvxVnni => avx2::vnni_available(),
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::Avx2 => avx2::available(),
            QgemmIsa::Scalar => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Rows of the register tile.
    fn rows(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::Avx512Vnni => avx512::MR,
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::AvxVnni | QgemmIsa::Avx2 => avx2::MR,
            _ => 1,
        }
    }
}

/// The best path this host has, chosen once per process.
pub(crate) fn cpu_qgemm_isa() -> QgemmIsa {
    static ISA: OnceLock<QgemmIsa> = OnceLock::new();
    *ISA.get_or_init(|| {
        QgemmIsa::ALL
            .into_iter()
            .find(|p| p.available())
            .unwrap_or(QgemmIsa::Scalar)
    })
}

/// `Kernel::Matmul` with `MatmulMath::Int8`: `out = act(a @ b + bias)` computed as the module
/// docs say, through the process's microkernel, the weight quantized once into `slot` (per
/// call without one).
///
/// # Safety
/// As [`super::matmul::matmul`]; `slot` is only ever given products whose `b` has the
/// contents it had when the slot was filled (the tensor layer gives storages written once).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
    slot: Option<&PackSlot>,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    matmul_on(cpu_qgemm_isa(), a, b, slot, bias, act, out, batch, m, n, k);
}

/// [`matmul`] through a given path (tests run each path the host has, with and without a
/// slot).
///
/// # Safety
/// As [`matmul`]; `isa` is available on this host.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_on(
    isa: QgemmIsa,
    a: &MatOperand,
    b: &MatOperand,
    slot: Option<&PackSlot>,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) {
    if batch == 0 || m == 0 || n == 0 {
        return;
    }
    if batch > 1 && b.batch_stride != 0 {
        // A batch of distinct weights: one product each, every weight quantized for its call.
        for bi in 0..batch {
            let ai = MatOperand {
                ptr: DevicePtr(a.ptr.0 + (bi * a.batch_stride * 4) as u64),
                ..*a
            };
            let bw = MatOperand {
                ptr: DevicePtr(b.ptr.0 + (bi * b.batch_stride * 4) as u64),
                ..*b
            };
            let oi = DevicePtr(out.0 + (bi * m * n * 4) as u64);
            matmul_on(isa, &ai, &bw, None, bias, act, oi, 1, m, n, k);
        }
        return;
    }
    let key = Key {
        ptr: b.ptr.0,
        rs: b.rs,
        cs: b.cs,
        n,
        k,
    };
    let fresh;
    let cached = slot.and_then(|s| {
        s.get_or_init(|| Box::new(quantize_b(b, k, n)))
            .downcast_ref::<QuantizedB>()
            .filter(|q| q.key == key)
    });
    let qb = match cached {
        Some(q) => q,
        None => {
            fresh = quantize_b(b, k, n);
            &fresh
        }
    };
    let qa = quantize_a(isa, a, batch, m, k);
    run(isa, &qa, qb, bias, act, out, batch * m, n);
}

/// The grid of (row block, panel) units over the pool (see the module docs).
///
/// # Safety
/// `out` is valid for `rows * n` writes, `bias` for `n` reads; `qa` and `qb` hold `rows`
/// rows and `n` columns of one product; `isa` is available.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    isa: QgemmIsa,
    qa: &QuantizedA,
    qb: &QuantizedB,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    rows: usize,
    n: usize,
) {
    let mr = isa.rows();
    let panels = n.div_ceil(NR);
    // The kernels read the bias a whole panel at a time: a copy padded with zeros.
    let mut bias_v = vec![0.0f32; panels * NR];
    if let Some(p) = bias {
        bias_v[..n].copy_from_slice(super::src(p, n));
    }
    let threads = intra_op::pool().map_or(1, |p| p.current_num_threads());
    // Row blocks: at least four units per thread, each block's quantized rows (1 byte per
    // input) about 256 KiB so they stay in L2 while a task walks the panels.
    let want = (4 * threads).div_ceil(panels).max(1);
    let cap = ((256 << 10) / qa.ld.max(1) / mr * mr).max(mr);
    let mb = rows.div_ceil(want).next_multiple_of(mr).min(cap).max(mr);
    let blocks = rows.div_ceil(mb);
    let units = blocks * panels;
    let work = mb * NR * qa.ld;
    intra_op::for_ranges_guided(units, work, 1, |r| {
        for u in r {
            let (ib, jp) = (u / panels, u % panels);
            let (i0, i1) = (ib * mb, ((ib + 1) * mb).min(rows));
            let j0 = jp * NR;
            let mut i = i0;
            while i < i1 {
                let tr = (i1 - i).min(mr);
                // SAFETY: rows i..i + tr of qa and panel jp of qb are in bounds; this unit
                // owns rows i0..i1, columns j0..j0 + NR (clipped to n) of out.
                let t = Tile {
                    steps: qb.steps,
                    a: qa.q.as_ptr().add(i * qa.ld),
                    lda: qa.ld,
                    a_scales: qa.scales.as_ptr().add(i * qa.groups),
                    groups: qa.groups,
                    w: qb.panel(jp),
                    info: qb.info(jp),
                    bias: bias_v.as_ptr().add(j0),
                    c: (out.0 as *mut f32).add(i * n + j0),
                    ldc: n,
                    cols: (n - j0).min(NR),
                    act,
                };
                tile(isa, tr, &t);
                i += tr;
            }
        }
    });
}

/// One register tile's operands: for `r` < the tile's rows and `j < cols`,
/// `c[r * ldc + j] = act(sum_g f32(corr[g][j] + sum_{s in g} a4[r][s] . w4[s][j]) *
/// (sa[r][g] * sw[g][j]) + bias[j])`, where `a4[r][s]` is the `s`-th four `u8` of row `r`
/// (at `a + r * lda`), `sa[r][g]` is `a_scales[r * groups + g]`, group `g` holds steps
/// `g * GROUP / 4` on (the last one fewer), `w4[s][j]` is column `j`'s four `i8` in step
/// `s` of the panel at `w`, and `corr[g]` and `sw[g]` the panel's 16 corrections and
/// scales of group `g` (`info[g]`). `bias` holds `NR` values (zero-padded).
#[derive(Clone, Copy)]
struct Tile {
    steps: usize,
    a: *const u8,
    lda: usize,
    a_scales: *const f32,
    groups: usize,
    w: *const i8,
    info: *const GroupInfo,
    bias: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    act: Activation,
}

/// Runs one tile of `rows` rows (at most the path's register tile).
///
/// # Safety
/// `isa` is available; the tile's pointers are valid for `rows` rows as [`Tile`] says.
unsafe fn tile(isa: QgemmIsa, rows: usize, t: &Tile) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        QgemmIsa::Avx512Vnni => avx512::tile(rows, t),
        #[cfg(target_arch = "x86_64")]
        QgemmIsa::AvxVnni => avx2::tile_vnni(rows, t),
        #[cfg(target_arch = "x86_64")]
        QgemmIsa::Avx2 => avx2::tile(rows, t),
        _ => {
            for r in 0..rows {
                let row = Tile {
                    a: t.a.add(r * t.lda),
                    a_scales: t.a_scales.add(r * t.groups),
                    c: t.c.add(r * t.ldc),
                    ..*t
                };
                scalar::row(&row);
            }
        }
    }
}

/// Adds one group's exact sum to a running `f32` sum: the order of operations every path
/// uses (the two scales' product, then the sum's, then the addition, each rounded once).
#[inline(always)]
fn add_group(sum: f32, acc: i32, a_scale: f32, w_scale: f32) -> f32 {
    sum + acc as f32 * (a_scale * w_scale)
}
