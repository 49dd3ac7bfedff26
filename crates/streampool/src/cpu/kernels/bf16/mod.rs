//! `bf16` matrix products on x86 hosts that have `bf16` arithmetic: the opt-in half
//! dtype of the CPU device (`--dtype bf16`), `f32` accumulation.
//!
//! | path | hardware | instruction | what it computes per step |
//! |---|---|---|---|
//! | [`Bf16Path::Amx`] | Sapphire Rapids and later (AMX-BF16) | `tdpbf16ps` | a 16 x 16 `f32` tile += 16 x 32 times 32 x 16 `bf16` |
//! | [`Bf16Path::Avx512Bf16`] | Cooper Lake, Sapphire Rapids, Zen 4 and later (AVX512_BF16) | `vdpbf16ps` | 16 `f32` lanes += pairs of `bf16` products |
//! | [`Bf16Path::Portable`] | any | `f32` `gemm` on widened copies | the `f32` product of the rounded inputs |
//!
//! The weight (`b`, `[k, n]` under any strides: a `Linear` keeps `W^T` contiguous) is
//! converted to `bf16` once, when the model loads, and packed on its first product into the
//! layout both instructions want: blocks of columns whose neighbours along `k` form one
//! 32-bit pair, `[n / block][k / 2][block]` words ([`pack_b`]; block 12 for the vector
//! kernel's 12 broadcasts, 16 for an AMX `B` tile in VNNI form). The packed weight is kept in
//! the weight's [`PackSlot`] and reused by every later product; an operand without one (a
//! batch of matrices, a temporary) is packed per call. The vector kernel also packs the
//! activations (panels of 16 rows, pairs interleaved: its 16 `f32` lanes are rows, and each
//! tile of the output is turned back on a small buffer); AMX loads them where they lie (16
//! rows of 32 neighbours are one `A` tile). The bias is added in `f32`, then the activation
//! and the one rounding to `bf16`, per tile.
//!
//! The path is chosen once per process: the best the host has, or `STREAMPOOL_CPU_BF16=amx`,
//! `avx512` or `portable` (the tunables' `cpu.bf16`, [`crate::config`]; a path the host
//! lacks falls back to the best it has). Products whose layout does not fit (an odd `k`,
//! activations not unit-strided along `k`) take the portable path; AMX takes products with
//! `n` and `k` multiples of 32, the vector kernel the rest.

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx512;

use std::sync::OnceLock;

use half::bf16;
use half::slice::HalfFloatSliceExt;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{Activation, MatOperand, PackSlot};
use crate::sync::Mutex;

/// How the CPU multiplies `bf16` matrices (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Path {
    /// AMX tiles (`tdpbf16ps`).
    Amx,
    /// AVX-512 `vdpbf16ps`.
    Avx512Bf16,
    /// `f32` `gemm` on widened copies.
    Portable,
}

impl Bf16Path {
    /// The name `STREAMPOOL_CPU_BF16` takes ([`crate::config::CpuTuning::bf16`]) and the
    /// bench prints.
    pub fn name(self) -> &'static str {
        match self {
            Bf16Path::Amx => "amx",
            Bf16Path::Avx512Bf16 => "avx512",
            Bf16Path::Portable => "portable",
        }
    }

    /// Whether this host can run the path (AMX also needs the kernel's permission, asked
    /// for once).
    pub fn available(self) -> bool {
        match self {
            #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
            Bf16Path::Amx => amx::available(),
            #[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
            Bf16Path::Amx => false,
            #[cfg(target_arch = "x86_64")]
            Bf16Path::Avx512Bf16 => avx512::available(),
            #[cfg(not(target_arch = "x86_64"))]
            Bf16Path::Avx512Bf16 => false,
            Bf16Path::Portable => true,
        }
    }
}

/// The path `bf16` products take in this process: the tunables' `cpu.bf16`
/// (`STREAMPOOL_CPU_BF16`, [`crate::config`]) if it names one the host has, else the best
/// the host has.
pub fn cpu_bf16_path() -> Bf16Path {
    static PATH: OnceLock<Bf16Path> = OnceLock::new();
    *PATH.get_or_init(|| {
        let best = [Bf16Path::Amx, Bf16Path::Avx512Bf16]
            .into_iter()
            .find(|p| p.available())
            .unwrap_or(Bf16Path::Portable);
        super::chosen_path(
            crate::config::CPU_BF16_ENV,
            crate::config::tuning().cpu.bf16,
            best,
            Bf16Path::available,
            Bf16Path::name,
        )
    })
}

/// `Kernel::Matmul` in `bf16` through the process's path ([`cpu_bf16_path`]); `false` (and
/// nothing written) when that path is the portable one or the layout does not fit, for the
/// caller to run the widened `f32` product.
///
/// # Safety
/// As [`super::matmul::matmul`], with `bf16` elements: operands valid for `[batch, m, k]` and
/// `[batch, k, n]` under their strides, `bias` for `n` reads, `out` for `batch * m * n`
/// writes, aliasing neither input.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
    b_pack: Option<&PackSlot>,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) -> bool {
    matmul_on(
        cpu_bf16_path(),
        a,
        b,
        b_pack,
        bias,
        act,
        out,
        batch,
        m,
        n,
        k,
    )
}

/// [`matmul`] through a given path (tests run each one the host has).
///
/// # Safety
/// As [`matmul`]; `path` is available on this host; `b_pack`, if any, is only ever given
/// products whose `b` has the contents it had when the slot was filled.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_on(
    path: Bf16Path,
    a: &MatOperand,
    b: &MatOperand,
    b_pack: Option<&PackSlot>,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) -> bool {
    // Pairs along k are read as one 32-bit word from the activations: unit stride along k
    // and an even k (an odd one would read past a row).
    if cfg!(not(target_arch = "x86_64"))
        || path == Bf16Path::Portable
        || a.cs != 1
        || !k.is_multiple_of(2)
        || k == 0
    {
        return false;
    }
    if batch == 0 || m == 0 || n == 0 {
        return true;
    }
    let use_amx = path == Bf16Path::Amx && amx_fits(n, k);
    let bias: Option<Vec<f32>> = bias.map(|p| {
        let mut v = vec![0.0f32; n];
        std::slice::from_raw_parts(p.0 as *const bf16, n).convert_to_f32_slice(&mut v);
        v
    });
    let epi = Epilogue {
        bias: bias.as_deref(),
        act,
    };
    let kp = k / 2;
    #[cfg(target_arch = "x86_64")]
    let block = if use_amx { 16 } else { avx512::NR };
    #[cfg(not(target_arch = "x86_64"))]
    let block = 16;
    // One matrix for every product: packed once into the weight's slot, if it has one.
    let cached = b_pack
        .filter(|_| batch == 1 || b.batch_stride == 0)
        .and_then(|slot| {
            let key = PackKey::of(b, n, k, block);
            let words = || Box::new((key, pack_b(b, 0, n, kp, block, Vec::new()))) as _;
            slot.get_or_init(words)
                .downcast_ref::<(PackKey, Vec<u32>)>()
                .filter(|(have, _)| *have == key)
                .map(|(_, w)| w.as_slice())
        });
    // The weight of product `bi`: the cached one, or packed now (into a spare buffer).
    let weight = |bi: usize| match cached {
        Some(w) => std::borrow::Cow::Borrowed(w),
        None => {
            let spare = SPARE_W.take(n.div_ceil(block) * kp * block);
            std::borrow::Cow::Owned(pack_b(b, bi, n, kp, block, spare))
        }
    };
    let give = |w: std::borrow::Cow<[u32]>| {
        if let std::borrow::Cow::Owned(w) = w {
            SPARE_W.give(w)
        }
    };
    let mut packed_a = Vec::new();
    for bi in 0..batch {
        let c = DevicePtr(out.0 + (bi * m * n * 2) as u64);
        // SAFETY: the path is available (the caller's contract); the packed operands are
        // built here from a[bi] and b[bi] in bounds (or were, for the cached weight, from
        // the same unchanged matrix), and `out[bi]` is this product's own `m x n`.
        #[cfg(all(target_arch = "x86_64", target_os = "linux"))]
        if use_amx {
            let w = weight(bi);
            let a_bi = DevicePtr(a.ptr.0 + (bi * a.batch_stride * 2) as u64);
            amx::product(a_bi, a.rs, &w, kp, c, m, n, &epi);
            give(w);
            continue;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let w = weight(bi);
            if packed_a.is_empty() {
                // Every element is written by pack_rows (rows past m as zeros).
                packed_a = SPARE_A.take(m.div_ceil(16).next_multiple_of(2) * kp * 32);
            }
            pack_rows(a, bi, m, k, &mut packed_a);
            let p = Packed {
                ptr: DevicePtr(packed_a.as_ptr() as u64),
                kp,
            };
            avx512::product(&p, &w, c, m, n, &epi);
            give(w);
        }
    }
    SPARE_A.give(packed_a);
    true
}

/// Which matrix a cached packed weight was made from: a slot's contents are used only by a
/// product of this very operand (its storage never changes, so the same view is the same
/// matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PackKey {
    ptr: u64,
    rs: usize,
    cs: usize,
    n: usize,
    k: usize,
    block: usize,
}

impl PackKey {
    fn of(b: &MatOperand, n: usize, k: usize, block: usize) -> Self {
        Self {
            ptr: b.ptr.0,
            rs: b.rs,
            cs: b.cs,
            n,
            k,
            block,
        }
    }
}

/// `b[bi]` (`[k, n]`, any strides) packed in blocks of `block` columns into `v` (resized):
/// word `(jb * kp + s) * block + j` holds `b[2s][col]` (low half) and `b[2s + 1][col]` for
/// column `col = jb * block + j` (the last block repeats column `n - 1`, whose sums are
/// dropped).
///
/// # Safety
/// `b` is valid for `[batch, 2 * kp, n]` reads of `bf16` under its strides.
pub(crate) unsafe fn pack_b(
    b: &MatOperand,
    bi: usize,
    n: usize,
    kp: usize,
    block: usize,
    mut v: Vec<u32>,
) -> Vec<u32> {
    let blocks = n.div_ceil(block);
    // Every word is written below.
    v.resize(blocks * kp * block, 0);
    let dst = DevicePtr(v.as_mut_ptr() as u64);
    let base = DevicePtr(b.ptr.0 + (bi * b.batch_stride * 2) as u64);
    let (rs, cs) = (b.rs, b.cs);
    intra_op::for_ranges(blocks, kp * block, |r| {
        for jb in r {
            for s in 0..kp {
                let e0 = (base.0 as *const u16).add(2 * s * rs);
                let e1 = e0.add(rs);
                // SAFETY: rows 2s and 2s + 1 < k and columns < n are in bounds (the
                // caller's contract); block jb is this task's own piece of `v`.
                let o = (dst.0 as *mut u32).add((jb * kp + s) * block);
                for j in 0..block {
                    let col = (jb * block + j).min(n - 1);
                    let lo = u32::from(e0.add(col * cs).read());
                    let hi = u32::from(e1.add(col * cs).read());
                    o.add(j).write(lo | hi << 16);
                }
            }
        }
    });
    v
}

/// Packing buffers kept between products: a fresh allocation of a packed weight (up to a
/// few MB) is a fresh `mmap` each call, whose page faults cost as much as a batch-1 product.
struct Spare<T> {
    bufs: OnceLock<Mutex<Vec<Vec<T>>>>,
}

/// The most bytes each [`Spare`] keeps.
const SPARE_BYTES: usize = 64 << 20;

static SPARE_W: Spare<u32> = Spare {
    bufs: OnceLock::new(),
};
static SPARE_A: Spare<u16> = Spare {
    bufs: OnceLock::new(),
};

impl<T: Copy + Default> Spare<T> {
    fn list(&self) -> &Mutex<Vec<Vec<T>>> {
        self.bufs.get_or_init(|| Mutex::new(Vec::new()))
    }

    /// A buffer of `len` elements (their values are left from earlier use: every caller
    /// writes each one before reading).
    fn take(&self, len: usize) -> Vec<T> {
        let found = {
            let mut list = self.list().lock();
            let best = (0..list.len())
                .filter(|&i| list[i].capacity() >= len)
                .min_by_key(|&i| list[i].capacity());
            best.map(|i| list.swap_remove(i))
        };
        let mut v = found.unwrap_or_default();
        v.resize(len, T::default());
        v
    }

    /// Keeps `v` for a later [`Spare::take`], dropping the smallest past [`SPARE_BYTES`].
    fn give(&self, v: Vec<T>) {
        let bytes = |v: &Vec<T>| v.capacity() * std::mem::size_of::<T>();
        if v.capacity() == 0 || bytes(&v) > SPARE_BYTES {
            return;
        }
        let mut list = self.list().lock();
        list.push(v);
        while list.iter().map(bytes).sum::<usize>() > SPARE_BYTES {
            let smallest = (0..list.len())
                .min_by_key(|&i| list[i].capacity())
                .unwrap_or(0);
            list.swap_remove(smallest);
        }
    }
}

/// The AMX kernel works on blocks of 32 output columns and steps of 32 along `k`; other
/// shapes take the AVX-512 kernel.
fn amx_fits(n: usize, k: usize) -> bool {
    n.is_multiple_of(32) && k.is_multiple_of(32)
}

/// The activations of one product packed for the vector kernel: panels of 16 rows (rows
/// past `m` are zero, and there is an even number of panels), each `kp` pairs of 16 rows x 2
/// `bf16`.
pub(crate) struct Packed {
    pub(crate) ptr: DevicePtr,
    pub(crate) kp: usize,
}

/// Packs `a[bi]` (`m x k`, unit stride along `k`) into `packed` (see [`Packed`]), panels in
/// parallel.
///
/// # Safety
/// `a` is valid for `[batch, m, k]` reads of `bf16` under its strides; `packed` holds
/// `panels * k / 2 * 32` elements.
unsafe fn pack_rows(a: &MatOperand, bi: usize, m: usize, k: usize, packed: &mut [u16]) {
    let kp = k / 2;
    let panel_len = kp * 32;
    let base = a.ptr;
    let dst = DevicePtr(packed.as_mut_ptr() as u64);
    let panels = packed.len() / panel_len;
    intra_op::for_ranges(panels, panel_len, |r| {
        for q in r {
            // SAFETY: panel `q` is this task's own slice of `packed`.
            let pan =
                std::slice::from_raw_parts_mut((dst.0 as *mut u16).add(q * panel_len), panel_len);
            for l in 0..16 {
                let i = q * 16 + l;
                if i >= m {
                    for p in 0..kp {
                        pan[p * 32 + l * 2] = 0;
                        pan[p * 32 + l * 2 + 1] = 0;
                    }
                    continue;
                }
                // SAFETY: row i < m of a[bi] spans k elements at unit stride.
                let row = std::slice::from_raw_parts(
                    (base.0 as *const u16).add(bi * a.batch_stride + i * a.rs),
                    k,
                );
                for p in 0..kp {
                    pan[p * 32 + l * 2] = row[2 * p];
                    pan[p * 32 + l * 2 + 1] = row[2 * p + 1];
                }
            }
        }
    });
}

/// What follows the product, per output element: `act(acc + bias[j])`, rounded to `bf16`.
pub(crate) struct Epilogue<'a> {
    pub(crate) bias: Option<&'a [f32]>,
    pub(crate) act: Activation,
}

/// Writes a kernel's tile to `out` through the epilogue: `tile[i * si + j * sj]` holds output
/// row `i`, column `j` (`rows <= 32`, `cols <= 32`); `bias` starts at column `j0`.
/// Inlined into the kernels' `target_feature` functions, so the loops vectorize for them.
///
/// # Safety
/// `out` is valid for `rows` rows of `cols` `bf16` writes at stride `ldo`, owned by this
/// task; `epi.bias` (if any) holds columns `j0..j0 + cols`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn store_tile(
    tile: &[f32],
    (si, sj): (usize, usize),
    rows: usize,
    cols: usize,
    out: *mut u16,
    ldo: usize,
    epi: &Epilogue,
    j0: usize,
) {
    // Turned back into rows (plus the bias), then the activation over the whole block in
    // one loop (it vectorizes; per-row loops of 12 columns did not, at 3x the cost).
    let mut buf = [0.0f32; 32 * 32];
    let v = &mut buf[..rows * cols];
    for (i, r) in v.chunks_exact_mut(cols).enumerate() {
        for (j, x) in r.iter_mut().enumerate() {
            *x = tile[i * si + j * sj];
        }
        if let Some(b) = epi.bias {
            for (x, b) in r.iter_mut().zip(&b[j0..j0 + cols]) {
                *x += b;
            }
        }
    }
    match epi.act {
        Activation::Identity => {}
        Activation::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
        Activation::Gelu => v.iter_mut().for_each(|x| *x = super::simd::gelu(*x)),
        Activation::GeluTanh => v
            .iter_mut()
            .for_each(|x| *x = super::simd::gelu_tanh_fast(*x)),
    }
    for (i, r) in v.chunks_exact(cols).enumerate() {
        let o = std::slice::from_raw_parts_mut(out.add(i * ldo), cols);
        for (o, x) in o.iter_mut().zip(r) {
            *o = to_bf16(*x);
        }
    }
}

/// `x` rounded to the nearest `bf16` (ties to even), as bits; NaN stays NaN. Branch-free,
/// so the loops above vectorize.
#[inline(always)]
pub(crate) fn to_bf16(x: f32) -> u16 {
    let b = x.to_bits();
    let rounded = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    if x.is_nan() {
        0x7fc0
    } else {
        rounded
    }
}

/// Tasks for the pool: about four per thread.
pub(crate) fn target_tasks() -> usize {
    4 * intra_op::pool().map_or(1, |p| p.current_num_threads())
}

#[cfg(test)]
mod tests;
