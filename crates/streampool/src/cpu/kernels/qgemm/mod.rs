//! Int8 products ([`MatmulMath::Int8`](crate::MatmulMath::Int8)): `f32` operands quantized
//! to 8-bit integers, multiplied with exact integer sums and scaled back to `f32`.
//!
//! What is computed, exactly (the tests check it against `f64`):
//!
//! - **Weights** (`b`, `[k, n]`), per output column `j`, once: `sw[j] = max_p |b[p, j]| / 127`
//!   and `qb[p, j] = clamp(round_even(b[p, j] * (127 / max_p |b[p, j]|)), -127, 127)` (all
//!   zero, scale 0, for a zero column). Kept in the weight's [`PackSlot`], packed for the
//!   microkernel, by the first product that uses it.
//! - **Activations** (`a`, `[m, k]`), per row `i` and group `g` of [`GROUP`] consecutive
//!   inputs, on every call: `sa[i, g] = max_{p in g} |a[i, p]| / 127` and `qa[i, p]` likewise;
//!   a row holding a NaN or an infinity gets NaN scales, so its outputs are NaN as they
//!   would be in `f32`.
//! - **Product**: per group, `acc[i, g, j] = sum_{p in g} qa[i, p] * qb[p, j]` in `i32`,
//!   exact (each term is at most 127^2); then `s[i, j] = sum_g f32(acc[i, g, j]) * sa[i, g]`
//!   in `f32`, group by group in order.
//! - **Epilogue**: `out[i, j] = act(s[i, j] * sw[j] + bias[j])`, each operation rounded once
//!   in `f32`, the activation as the `f32` products apply it.
//!
//! Why groups: a transformer's activations have a few channels far larger than the rest
//! (BERT's "outlier dimensions"); one scale per token spends the 8 bits on those, and
//! all-MiniLM-L6-v2 with per-token scales missed the accuracy gate (mean cosine 0.9972 to its
//! f32). A scale per 32 inputs confines an outlier to its own group, at the cost of one
//! convert and multiply-add per accumulator per group (activations are quantized in blocks
//! of 32 in llama.cpp's `Q8` formats for the same reason).
//!
//! Both operands are symmetric (no zero points) and `-128` is never used, so every path
//! computes the same integers. The microkernel does not need 8-bit products: on AVX2,
//! `vpmaddubsw` (u8 x s8 pairs into `i16`) saturates once two products of 255 x 127 meet, so
//! we widen both operands to `i16` once (the weight at packing, the activations when they
//! are quantized) and multiply with `vpmaddwd`, which sums two `i16` products into an `i32`
//! lane without any rounding or saturation: one instruction per 16 multiply-adds, twice what
//! an `f32` FMA does, and nothing to correct afterwards.
//!
//! | path | hardware | register tile | weight panel |
//! |---|---|---|---|
//! | [`QgemmIsa::Avx2`] | AVX2 | 6 rows x 16 columns (12 `ymm` `i32` accumulators) | 16 columns |
//! | [`QgemmIsa::Scalar`] | any | one row at a time | same layout |
//!
//! The weight is packed into panels of 16 columns, each step holding two consecutive `k`
//! of every column (`[n / 16][k / 2][16][2]` `i16`, zero past `n` and past an odd `k`): the
//! AVX2 kernel loads a step as two vectors and broadcasts the matching pair of each
//! activation row. The product is split over the intra-op pool as the `f32` products are:
//! a grid of (row block, panel) units claimed by the pool's tasks, a row block sized to
//! stay in L2 while a task walks the panels.
//!
//! The packed weight is half the size of the `f32` one; it lives beside the `f32` weight it
//! was made from (the tensor layer keeps the original).

#[cfg(target_arch = "x86_64")]
mod avx2;
mod scalar;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{Activation, MatOperand, PackSlot};

/// Inputs per activation scale (even: the kernels read inputs in pairs).
pub(crate) const GROUP: usize = 32;

/// Columns of a weight panel (every path reads the same packing).
const NR: usize = 16;

/// Which microkernel multiplies int8 products (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QgemmIsa {
    /// 6 x 16 tiles of `vpmaddwd` in AVX2 registers.
    Avx2,
    /// Portable loops (any host).
    Scalar,
}

impl QgemmIsa {
    /// Whether this host can run the path.
    pub(crate) fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::Avx2 => avx2::available(),
            #[cfg(not(target_arch = "x86_64"))]
            QgemmIsa::Avx2 => false,
            QgemmIsa::Scalar => true,
        }
    }

    /// Rows of the register tile.
    fn rows(self) -> usize {
        match self {
            #[cfg(target_arch = "x86_64")]
            QgemmIsa::Avx2 => avx2::MR,
            _ => 1,
        }
    }
}

/// The best path this host has, chosen once per process.
pub(crate) fn cpu_qgemm_isa() -> QgemmIsa {
    static ISA: OnceLock<QgemmIsa> = OnceLock::new();
    *ISA.get_or_init(|| {
        if QgemmIsa::Avx2.available() {
            QgemmIsa::Avx2
        } else {
            QgemmIsa::Scalar
        }
    })
}

/// One step of a packed panel: two `k` of 16 columns, a cache line.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Step([i16; 2 * NR]);

/// Which matrix a quantized weight was made from: a slot's contents serve only products of
/// this very operand (its storage never changes, so the same view is the same matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    ptr: u64,
    rs: usize,
    cs: usize,
    n: usize,
    k: usize,
}

/// A weight `[k, n]` quantized per column and packed (see the module docs).
pub(crate) struct QuantizedB {
    key: Key,
    /// Steps per panel: `k` rounded up to even, halved.
    steps: usize,
    /// `panels * steps` steps.
    packed: Vec<Step>,
    /// `sw[j]`, zero past `n` (whole panels).
    scales: Vec<f32>,
}

impl QuantizedB {
    /// Panel `jp`'s steps.
    fn panel(&self, jp: usize) -> *const i16 {
        // In bounds: jp < n.div_ceil(NR) panels of `steps` steps were allocated.
        self.packed.as_ptr().wrapping_add(jp * self.steps) as *const i16
    }

    /// The quantized value `qb[p, j]` (tests read the integers the kernels multiply).
    #[cfg(test)]
    fn q(&self, p: usize, j: usize) -> i16 {
        self.packed[j / NR * self.steps + p / 2].0[(j % NR) * 2 + p % 2]
    }
}

/// `round_even(x * inv)` clamped to `[-127, 127]`: the rounding every path uses.
#[inline(always)]
fn quantize_value(x: f32, inv: f32) -> i16 {
    (x * inv).round_ties_even().clamp(-127.0, 127.0) as i16
}

/// The scale `max |x| / 127` of a row or column of largest magnitude `amax`, and the factor
/// `127 / amax` its values are multiplied by (0 for a zero row: every value quantizes to 0).
#[inline(always)]
fn scales_of(amax: f32) -> (f32, f32) {
    if amax > 0.0 {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    }
}

/// Quantizes and packs `b` (`[k, n]` under its strides), panels in parallel.
///
/// # Safety
/// `b` is valid for `[k, n]` reads of `f32` under its strides.
unsafe fn quantize_b(b: &MatOperand, k: usize, n: usize) -> QuantizedB {
    let panels = n.div_ceil(NR);
    let steps = k.div_ceil(2);
    let mut packed = vec![Step::default(); panels * steps];
    let mut scales = vec![0.0f32; panels * NR];
    let (src, rs, cs) = (b.ptr, b.rs, b.cs);
    let dst = DevicePtr(packed.as_mut_ptr() as u64);
    let sdst = DevicePtr(scales.as_mut_ptr() as u64);
    intra_op::for_ranges(panels, k * NR, |r| {
        for jp in r {
            // SAFETY: panel jp's steps and scales are this task's own; rows < k and columns
            // < n of b are in bounds (the caller's contract).
            let panel = std::slice::from_raw_parts_mut((dst.0 as *mut Step).add(jp * steps), steps);
            let sc = std::slice::from_raw_parts_mut((sdst.0 as *mut f32).add(jp * NR), NR);
            let at = |p: usize, j: usize| (src.0 as *const f32).add(p * rs + j * cs).read();
            let cols = (n - jp * NR).min(NR);
            for (c, sc) in sc.iter_mut().enumerate().take(cols) {
                let j = jp * NR + c;
                let amax = (0..k).fold(0.0f32, |m, p| m.max(at(p, j).abs()));
                let (scale, inv) = scales_of(amax);
                *sc = scale;
                for p in 0..k {
                    panel[p / 2].0[c * 2 + p % 2] = quantize_value(at(p, j), inv);
                }
            }
        }
    });
    QuantizedB {
        key: Key {
            ptr: b.ptr.0,
            rs,
            cs,
            n,
            k,
        },
        steps,
        packed,
        scales,
    }
}

/// Activation rows quantized for one call: row `r` is `ld` `i16` (zero past `k`), with
/// `groups` scales.
struct QuantizedA {
    q: Vec<i16>,
    scales: Vec<f32>,
    /// `i16` per row.
    ld: usize,
    /// Scales per row: `k.div_ceil(GROUP)`.
    groups: usize,
}

/// Quantizes the `batch * m` rows of `a` (row `bi * m + i` is `a[bi]`'s row `i`), in
/// parallel.
///
/// # Safety
/// `a` is valid for `[batch, m, k]` reads of `f32` under its strides.
unsafe fn quantize_a(
    isa: QgemmIsa,
    a: &MatOperand,
    batch: usize,
    m: usize,
    k: usize,
) -> QuantizedA {
    let ld = k.div_ceil(2) * 2;
    let groups = k.div_ceil(GROUP);
    let rows = batch * m;
    let mut q = vec![0i16; rows * ld];
    let mut scales = vec![0.0f32; rows * groups];
    let (qd, sd) = (
        DevicePtr(q.as_mut_ptr() as u64),
        DevicePtr(scales.as_mut_ptr() as u64),
    );
    intra_op::for_ranges(rows, k, |r| {
        for row in r {
            let (bi, i) = (row / m, row % m);
            let src = (a.ptr.0 as *const f32).add(bi * a.batch_stride + i * a.rs);
            // SAFETY: row `row` of the buffers is this task's own; a's row is in bounds.
            let out = std::slice::from_raw_parts_mut((qd.0 as *mut i16).add(row * ld), k);
            let sc = std::slice::from_raw_parts_mut((sd.0 as *mut f32).add(row * groups), groups);
            let mut finite = true;
            for (g, scale) in sc.iter_mut().enumerate() {
                let p = g * GROUP;
                let len = (k - p).min(GROUP);
                let part = &mut out[p..p + len];
                let (s, ok) = match isa {
                    #[cfg(target_arch = "x86_64")]
                    QgemmIsa::Avx2 if a.cs == 1 => {
                        avx2::quantize_group(std::slice::from_raw_parts(src.add(p), len), part)
                    }
                    _ => scalar::quantize_group(|i| src.add((p + i) * a.cs).read(), part),
                };
                *scale = s;
                finite &= ok;
            }
            if !finite {
                sc.fill(f32::NAN);
            }
        }
    });
    QuantizedA {
        q,
        scales,
        ld,
        groups,
    }
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
/// rows and `n` columns of one product.
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
    // Row blocks: at least four units per thread, each block's quantized rows (2 bytes per
    // input) about 256 KiB so they stay in L2 while a task walks the panels.
    let want = (4 * threads).div_ceil(panels).max(1);
    let cap = ((256 << 10) / (2 * qa.ld.max(1)) / mr * mr).max(mr);
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
                    w_scales: qb.scales.as_ptr().add(j0),
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
/// `c[r * ldc + j] = act((sum_g f32(sum_{s in g} a2[r][s] . w2[s][j]) * sa[r][g]) *
/// w_scales[j] + bias[j])`, where `a2[r][s]` is the `s`-th pair of row `r` (at `a + r *
/// lda`), `sa[r][g]` is `a_scales[r * groups + g]`, group `g` holds steps `g * GROUP / 2`
/// on (the last one fewer), and `w2[s][j]` is column `j`'s pair in step `s` of the panel at
/// `w`. `w_scales` and `bias` hold `NR` values (zero-padded).
#[derive(Clone, Copy)]
pub(super) struct Tile {
    pub(super) steps: usize,
    pub(super) a: *const i16,
    pub(super) lda: usize,
    pub(super) a_scales: *const f32,
    pub(super) groups: usize,
    pub(super) w: *const i16,
    pub(super) w_scales: *const f32,
    pub(super) bias: *const f32,
    pub(super) c: *mut f32,
    pub(super) ldc: usize,
    pub(super) cols: usize,
    pub(super) act: Activation,
}

/// Runs one tile of `rows` rows (at most the path's register tile).
///
/// # Safety
/// `isa` is available; the tile's pointers are valid for `rows` rows as [`Tile`] says.
unsafe fn tile(isa: QgemmIsa, rows: usize, t: &Tile) {
    match isa {
        #[cfg(target_arch = "x86_64")]
        QgemmIsa::Avx2 => match rows {
            6 => avx2::tile::<6>(t),
            5 => avx2::tile::<5>(t),
            4 => avx2::tile::<4>(t),
            3 => avx2::tile::<3>(t),
            2 => avx2::tile::<2>(t),
            _ => avx2::tile::<1>(t),
        },
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
/// uses.
#[inline(always)]
fn add_group(sum: f32, acc: i32, a_scale: f32) -> f32 {
    sum + acc as f32 * a_scale
}

/// The epilogue before the activation.
#[inline(always)]
fn dequantize(sum: f32, w_scale: f32, bias: f32) -> f32 {
    sum * w_scale + bias
}
