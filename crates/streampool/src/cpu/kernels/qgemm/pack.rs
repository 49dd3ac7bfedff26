//! The two operands in the form every microkernel reads: the weight quantized per column and
//! packed into panels (once, kept in its [`PackSlot`](crate::kernel::PackSlot)), and the
//! activation rows quantized per group and offset to `u8` (on every call).

use super::{QgemmIsa, A_MAX, A_ZERO, GROUP, NR, W_MAX};
use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::MatOperand;

/// Inputs of one step: the four consecutive `k` a `vpmaddubsw` + `vpmaddwd` pair (or one
/// `vpdpbusd`) sums into an `i32` lane.
pub(super) const KSTEP: usize = 4;

/// One step of a packed panel: four `k` of 16 columns (`[16][4]` `i8`), a cache line.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Step(pub(super) [i8; KSTEP * NR]);

/// One group of a panel's 16 columns: the weight scales `sw[g, j]`, and the corrections
/// `-A_ZERO * sum_{p in g} qb[p, j]` (the activations' offset times the column's sum over
/// the group), what every group's integer sum starts from.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct GroupInfo {
    pub(super) correction: [i32; NR],
    pub(super) scale: [f32; NR],
}

/// Which matrix a quantized weight was made from: a slot's contents serve only products of
/// this very operand (its storage never changes, so the same view is the same matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Key {
    pub(super) ptr: u64,
    pub(super) rs: usize,
    pub(super) cs: usize,
    pub(super) n: usize,
    pub(super) k: usize,
}

/// A weight `[k, n]` quantized per column and group and packed (see the module docs).
pub(crate) struct QuantizedB {
    pub(super) key: Key,
    /// Steps per panel: `k.div_ceil(KSTEP)`.
    pub(super) steps: usize,
    /// Groups per panel: `k.div_ceil(GROUP)`.
    pub(super) groups: usize,
    /// `panels * steps` steps, zero past `n` and past `k`.
    packed: Vec<Step>,
    /// `panels * groups` scales and corrections, panel by panel (zero past `n`).
    info: Vec<GroupInfo>,
}

impl QuantizedB {
    /// Panel `jp`'s steps.
    pub(super) fn panel(&self, jp: usize) -> *const i8 {
        // In bounds: jp < n.div_ceil(NR) panels of `steps` steps were allocated.
        self.packed.as_ptr().wrapping_add(jp * self.steps) as *const i8
    }

    /// Panel `jp`'s scales and corrections, one per group.
    pub(super) fn info(&self, jp: usize) -> *const GroupInfo {
        // In bounds: jp < n.div_ceil(NR) panels of `groups` entries were allocated.
        self.info.as_ptr().wrapping_add(jp * self.groups)
    }

    /// The quantized value `qb[p, j]` (tests read the integers the kernels multiply).
    #[cfg(test)]
    pub(super) fn q(&self, p: usize, j: usize) -> i8 {
        self.packed[j / NR * self.steps + p / KSTEP].0[(j % NR) * KSTEP + p % KSTEP]
    }

    /// Group `g`'s correction of column `j`.
    #[cfg(test)]
    pub(super) fn correction(&self, g: usize, j: usize) -> i32 {
        self.info[j / NR * self.groups + g].correction[j % NR]
    }

    /// Group `g`'s scale of column `j`.
    #[cfg(test)]
    pub(super) fn scale(&self, g: usize, j: usize) -> f32 {
        self.info[j / NR * self.groups + g].scale[j % NR]
    }
}

/// `round_even(x * inv)` clamped to `[-max, max]`: the rounding every path uses.
#[inline(always)]
pub(super) fn quantize_value(x: f32, inv: f32, max: f32) -> i32 {
    (x * inv).round_ties_even().clamp(-max, max) as i32
}

/// The scale `amax / max` of a group or column of largest magnitude `amax` quantized to
/// `[-max, max]`, and the factor `max / amax` its values are multiplied by (0 for a zero one:
/// every value quantizes to 0).
#[inline(always)]
pub(super) fn scales_of(amax: f32, max: f32) -> (f32, f32) {
    if amax > 0.0 {
        (amax / max, max / amax)
    } else {
        (0.0, 0.0)
    }
}

/// Quantizes and packs `b` (`[k, n]` under its strides), panels in parallel.
///
/// # Safety
/// `b` is valid for `[k, n]` reads of `f32` under its strides.
pub(super) unsafe fn quantize_b(b: &MatOperand, k: usize, n: usize) -> QuantizedB {
    let panels = n.div_ceil(NR);
    let steps = k.div_ceil(KSTEP);
    let groups = k.div_ceil(GROUP);
    let mut packed = vec![Step([0; KSTEP * NR]); panels * steps];
    let zero = GroupInfo {
        correction: [0; NR],
        scale: [0.0; NR],
    };
    let mut info = vec![zero; panels * groups];
    let (src, rs, cs) = (b.ptr, b.rs, b.cs);
    let dst = DevicePtr(packed.as_mut_ptr() as u64);
    let idst = DevicePtr(info.as_mut_ptr() as u64);
    intra_op::for_ranges(panels, k * NR, |r| {
        for jp in r {
            // SAFETY: panel jp's steps and group entries are this task's own; rows < k and
            // columns < n of b are in bounds (the caller's contract).
            let panel = std::slice::from_raw_parts_mut((dst.0 as *mut Step).add(jp * steps), steps);
            let info =
                std::slice::from_raw_parts_mut((idst.0 as *mut GroupInfo).add(jp * groups), groups);
            let at = |p: usize, j: usize| (src.0 as *const f32).add(p * rs + j * cs).read();
            let cols = (n - jp * NR).min(NR);
            for c in 0..cols {
                let j = jp * NR + c;
                for (g, info) in info.iter_mut().enumerate() {
                    let ps = g * GROUP..k.min((g + 1) * GROUP);
                    let amax = ps.clone().fold(0.0f32, |m, p| m.max(at(p, j).abs()));
                    let (scale, inv) = scales_of(amax, W_MAX);
                    info.scale[c] = scale;
                    for p in ps {
                        let q = quantize_value(at(p, j), inv, W_MAX);
                        // |q| <= W_MAX < 128: an i8.
                        panel[p / KSTEP].0[c * KSTEP + p % KSTEP] = q as i8;
                        info.correction[c] -= A_ZERO * q;
                    }
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
        groups,
        packed,
        info,
    }
}

/// Activation rows quantized for one call: row `r` is `ld` `u8` (`qa + A_ZERO`; `A_ZERO`
/// past `k`, where the weight is zero), with `groups` scales.
pub(super) struct QuantizedA {
    pub(super) q: Vec<u8>,
    pub(super) scales: Vec<f32>,
    /// `u8` per row: `k` rounded up to a whole step.
    pub(super) ld: usize,
    /// Scales per row: `k.div_ceil(GROUP)`.
    pub(super) groups: usize,
}

/// Quantizes the `batch * m` rows of `a` (row `bi * m + i` is `a[bi]`'s row `i`), in
/// parallel.
///
/// # Safety
/// `a` is valid for `[batch, m, k]` reads of `f32` under its strides; `isa` is available.
pub(super) unsafe fn quantize_a(
    isa: QgemmIsa,
    a: &MatOperand,
    batch: usize,
    m: usize,
    k: usize,
) -> QuantizedA {
    let ld = k.div_ceil(KSTEP) * KSTEP;
    let groups = k.div_ceil(GROUP);
    let rows = batch * m;
    // Written row by row by the pool's tasks (each row's first touch, page faults included,
    // in parallel: filling the buffers here first was a serial pass over them per product,
    // which a 16-core host felt).
    let mut q: Vec<u8> = Vec::with_capacity(rows * ld);
    let mut scales: Vec<f32> = Vec::with_capacity(rows * groups);
    let (qd, sd) = (
        DevicePtr(q.as_mut_ptr() as u64),
        DevicePtr(scales.as_mut_ptr() as u64),
    );
    let vector = isa != QgemmIsa::Scalar && a.cs == 1;
    intra_op::for_ranges(rows, k, |r| {
        for row in r {
            let (bi, i) = (row / m, row % m);
            let src = (a.ptr.0 as *const f32).add(bi * a.batch_stride + i * a.rs);
            // SAFETY: row `row` of the buffers (within their capacity) is this task's own,
            // initialized here before any reference to it is made; a's row is in bounds.
            let (qrow, srow) = (
                (qd.0 as *mut u8).add(row * ld),
                (sd.0 as *mut f32).add(row * groups),
            );
            std::ptr::write_bytes(qrow, A_ZERO as u8, ld);
            std::ptr::write_bytes(srow, 0, groups);
            let out = std::slice::from_raw_parts_mut(qrow, k);
            let sc = std::slice::from_raw_parts_mut(srow, groups);
            let mut finite = true;
            for (g, scale) in sc.iter_mut().enumerate() {
                let p = g * GROUP;
                let len = (k - p).min(GROUP);
                let part = &mut out[p..p + len];
                let (s, ok) = if vector {
                    quantize_group_vector(std::slice::from_raw_parts(src.add(p), len), part)
                } else {
                    quantize_group(|i| src.add((p + i) * a.cs).read(), part)
                };
                *scale = s;
                finite &= ok;
            }
            if !finite {
                sc.fill(f32::NAN);
            }
        }
    });
    // SAFETY: the tasks above initialized every row of both (the pool runs every item).
    unsafe {
        q.set_len(rows * ld);
        scales.set_len(rows * groups);
    }
    QuantizedA {
        q,
        scales,
        ld,
        groups,
    }
}

/// [`quantize_group`] of contiguous values through AVX2 where the host has it.
///
/// # Safety
/// A vector path was chosen, so the host has AVX2 (every vector path requires it).
#[inline(always)]
unsafe fn quantize_group_vector(x: &[f32], out: &mut [u8]) -> (f32, bool) {
    #[cfg(target_arch = "x86_64")]
    {
        super::avx2::quantize_group(x, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        quantize_group(|i| x[i], out)
    }
}

/// Quantizes one group of `out.len()` activations read by `at(i)` into `out` as `qa +
/// A_ZERO`: returns its scale and whether every value was finite (else `out` holds `A_ZERO`,
/// the quantized zero).
#[inline(always)]
pub(super) fn quantize_group(at: impl Fn(usize) -> f32, out: &mut [u8]) -> (f32, bool) {
    let mut amax = 0.0f32;
    let mut finite = true;
    for i in 0..out.len() {
        let x = at(i);
        finite &= x.is_finite();
        amax = amax.max(x.abs());
    }
    if !finite {
        out.fill(A_ZERO as u8);
        return (f32::NAN, false);
    }
    let (scale, inv) = scales_of(amax, A_MAX);
    for (i, q) in out.iter_mut().enumerate() {
        // In [A_ZERO - A_MAX, A_ZERO + A_MAX], within u8 (the constants' contract).
        *q = (quantize_value(at(i), inv, A_MAX) + A_ZERO) as u8;
    }
    (scale, true)
}
