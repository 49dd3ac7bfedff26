//! `f32` products against a prepacked weight: our own register-blocked microkernels
//! over a weight packed once, when its first product runs, and kept in the weight's
//! [`PackSlot`] for every later product on any stream or thread.
//!
//! | path | hardware | register tile | weight panel |
//! |---|---|---|---|
//! | [`SgemmIsa::Avx512`] | AVX-512F | 8 rows x 48 columns (24 `zmm` accumulators) | 48 columns |
//! | [`SgemmIsa::Avx2`] | AVX2 + FMA | 6 rows x 16 columns (12 `ymm` accumulators) | 16 columns |
//!
//! The weight (`b`, `[k, n]` under any strides: a `Linear` keeps `W^T` contiguous) is packed
//! into panels of `NR` columns, `[n / NR][k][NR]`, zero past `n`, 64-byte aligned
//! ([`PackedB`]): each step of a microkernel loads one row of a panel (`NR` consecutive
//! floats) and broadcasts one element of each of its `MR` activation rows, read where they
//! lie (any strides: broadcasts need no packing). The accumulators start from the bias; the
//! activation is applied to the tile while it is in cache.
//!
//! The product is split over the intra-op pool as a grid of (row block, panel) units in
//! row-block order, so that the contiguous run of units a pool task takes shares its rows:
//! a row block (at most [`block_rows`] rows, about 256 KiB of activations) stays in L2 while
//! the task walks the panels, and each panel is read once per row block. Rows are split
//! finer when the grid would give fewer than four units per thread (batch 1;
//! `STREAMPOOL_CPU_SGEMM_UNITS=N` for N). The pool's tasks claim runs of units from one
//! shared counter ([`intra_op::for_ranges_guided`]: long runs first, short ones as the grid
//! drains): on the 16-core Xeon that gave MiniLM's products 12-24% over fixed pieces
//! (`STREAMPOOL_CPU_SGEMM_SCHED=pieces`, the split before, which left some threads a piece
//! behind), 1,229-1,480 GFLOP/s of the host's 1,556 (`bench/results/cpu-forward/`).
//! Each tile runs the whole of `k` in one pass by default; `STREAMPOOL_CPU_SGEMM_KC=N` makes
//! passes of `N` (a panel's rows then stay in L1 across the row tiles; the row block is then
//! sized for `N` columns): on that Xeon, steps of 192 or 256 were 1.4x faster on one thread
//! and 10-25% slower on 16 at MiniLM's shapes (the same files), so the default is one pass.
//!
//! The weight's packed copy lives as long as the weight and is as large (`f32`, rounded up
//! to whole panels): a model's weights take twice their size on the CPU once each has run.
//!
//! The path is chosen once per process: the best the host has, or `STREAMPOOL_CPU_SGEMM=
//! avx512`, `avx2` or `gemm` (the last: the `gemm` crate's tiles, as products without a
//! slot take). A batch of distinct matrices (attention's generic path) and `k == 0` are
//! left to the `gemm` crate.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::config::{SgemmPath, SgemmSchedule};
use crate::cpu::intra_op;
use crate::kernel::{Activation, MatOperand, PackSlot};

/// Which of our `f32` microkernels multiplies prepacked weights (see the module table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SgemmIsa {
    /// 8 x 48 tiles in AVX-512 registers.
    Avx512,
    /// 6 x 16 tiles in AVX2 registers.
    Avx2,
}

impl SgemmIsa {
    /// The name `STREAMPOOL_CPU_SGEMM` takes ([`crate::config::CpuTuning::sgemm`]).
    pub fn name(self) -> &'static str {
        match self {
            SgemmIsa::Avx512 => "avx512",
            SgemmIsa::Avx2 => "avx2",
        }
    }

    /// Whether this host can run the path.
    pub fn available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                SgemmIsa::Avx512 => avx512::available(),
                SgemmIsa::Avx2 => avx2::available(),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Rows and columns of the register tile (`MR`, `NR`).
    fn geometry(self) -> (usize, usize) {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                SgemmIsa::Avx512 => (avx512::MR, avx512::NR),
                SgemmIsa::Avx2 => (avx2::MR, avx2::NR),
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        (1, 1)
    }
}

/// The path prepacked `f32` products take in this process: the tunables' `cpu.sgemm`
/// (`STREAMPOOL_CPU_SGEMM`, [`crate::config`]) if it names one the host has, else the best
/// the host has; `None` (the `gemm` crate) when the host has neither or the setting says
/// `gemm`.
pub fn cpu_sgemm_isa() -> Option<SgemmIsa> {
    static ISA: OnceLock<Option<SgemmIsa>> = OnceLock::new();
    *ISA.get_or_init(|| {
        let best = [SgemmIsa::Avx512, SgemmIsa::Avx2]
            .into_iter()
            .find(|p| p.available());
        let forced = crate::config::tuning().cpu.sgemm.map(|p| match p {
            SgemmPath::Avx512 => Some(SgemmIsa::Avx512),
            SgemmPath::Avx2 => Some(SgemmIsa::Avx2),
            SgemmPath::Gemm => None,
        });
        super::chosen_path(
            crate::config::CPU_SGEMM_ENV,
            forced,
            best,
            |p| p.is_none_or(SgemmIsa::available),
            |p| p.map_or("gemm", SgemmIsa::name),
        )
    })
}

/// One cache line of a packed weight: the allocation unit that keeps panels 64-byte aligned.
#[derive(Clone, Copy, Default)]
#[repr(C, align(64))]
struct Line([f32; 16]);

/// Which matrix a packed weight was made from, and for which microkernel: a slot's contents
/// serve only products of this very operand (its storage never changes, so the same view
/// is the same matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Key {
    ptr: u64,
    rs: usize,
    cs: usize,
    n: usize,
    k: usize,
    isa: SgemmIsa,
}

/// A weight `[k, n]` in panels of `nr` columns: element `(p, j)` at `(j / nr * k + p) * nr +
/// j % nr`, zero for `j >= n`.
pub(crate) struct PackedB {
    key: Key,
    lines: Vec<Line>,
}

impl PackedB {
    /// Panel `jp`'s `k * nr` floats.
    fn panel(&self, jp: usize, nr: usize) -> *const f32 {
        // In bounds: jp < n.div_ceil(nr) panels of k * nr floats each were allocated.
        (self.lines.as_ptr() as *const f32).wrapping_add(jp * self.key.k * nr)
    }
}

/// Packs `b` (`[k, n]` under its strides) for `isa`'s microkernel, panels in parallel.
///
/// # Safety
/// `b` is valid for `[k, n]` reads of `f32` under its strides.
unsafe fn pack(b: &MatOperand, k: usize, n: usize, isa: SgemmIsa) -> PackedB {
    let (_, nr) = isa.geometry();
    let panels = n.div_ceil(nr);
    let floats = panels * k * nr;
    // Every float is written below (zeros past n).
    let mut lines = vec![Line::default(); floats.div_ceil(16)];
    let dst = DevicePtr(lines.as_mut_ptr() as u64);
    let (src, rs, cs) = (b.ptr, b.rs, b.cs);
    intra_op::for_ranges(panels, k * nr, |r| {
        for jp in r {
            // SAFETY: panel jp is this task's own k * nr floats of `lines`; rows < k and
            // columns < n of b are in bounds (the caller's contract).
            let o = std::slice::from_raw_parts_mut((dst.0 as *mut f32).add(jp * k * nr), k * nr);
            let cols = (n - jp * nr).min(nr);
            for (p, row) in o.chunks_exact_mut(nr).enumerate() {
                let s = (src.0 as *const f32).add(p * rs + jp * nr * cs);
                for (j, x) in row.iter_mut().enumerate() {
                    *x = if j < cols { s.add(j * cs).read() } else { 0.0 };
                }
            }
        }
    });
    PackedB {
        key: Key {
            ptr: b.ptr.0,
            rs,
            cs,
            n,
            k,
            isa,
        },
        lines,
    }
}

/// `Kernel::Matmul` in `f32` through the process's microkernel ([`cpu_sgemm_isa`]) with the
/// weight packed once into `slot`; `false` (nothing written) when it does not apply (no
/// path, a batch of distinct matrices, `k == 0`), for the caller's `gemm` crate path.
///
/// # Safety
/// As [`super::matmul::matmul`]; `slot` is only ever given products whose `b` has the
/// contents it had when the slot was filled (the tensor layer gives storages written once).
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
    slot: &PackSlot,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
) -> bool {
    match cpu_sgemm_isa() {
        Some(isa) => matmul_on(isa, a, b, Some(slot), bias, act, out, batch, m, n, k),
        None => false,
    }
}

/// [`matmul`] through a given path; without a slot the weight is packed for this call only
/// (tests run each path the host has both ways).
///
/// # Safety
/// As [`matmul`]; `isa` is available on this host.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn matmul_on(
    isa: SgemmIsa,
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
) -> bool {
    if k == 0 || !(batch <= 1 || b.batch_stride == 0) {
        return false;
    }
    if batch == 0 || m == 0 || n == 0 {
        return true;
    }
    let key = Key {
        ptr: b.ptr.0,
        rs: b.rs,
        cs: b.cs,
        n,
        k,
        isa,
    };
    let fresh;
    let cached = slot.and_then(|s| {
        s.get_or_init(|| Box::new(pack(b, k, n, isa)))
            .downcast_ref::<PackedB>()
            .filter(|p| p.key == key)
    });
    let packed = match cached {
        Some(p) => p,
        None => {
            fresh = pack(b, k, n, isa);
            &fresh
        }
    };
    run(isa, a, packed, bias, act, out, batch, m, n, k, k_step(k));
    true
}

/// Rows per row block: about 256 KiB of activations (the tunables' `cpu.sgemm_block_kib`,
/// `STREAMPOOL_CPU_SGEMM_BLOCK_KIB`, for tuning on new hosts), so a block stays in L2 while
/// a task walks the weight's panels; at least one register tile, a whole number of them.
fn block_rows(k: usize, mr: usize) -> usize {
    let kib = crate::config::tuning().cpu.sgemm_block_kib;
    ((kib << 10) / (4 * k.max(1)) / mr * mr).max(mr)
}

/// Steps along `k` of each pass of the row tiles over a panel: the tunables'
/// `cpu.sgemm_kc` (`STREAMPOOL_CPU_SGEMM_KC`; 0: all of `k` in one step).
fn k_step(k: usize) -> usize {
    let kc = crate::config::tuning().cpu.sgemm_kc;
    if kc == 0 {
        k
    } else {
        kc.min(k)
    }
}

/// The grid and its loop (see the module docs).
///
/// # Safety
/// As [`matmul_on`], with `packed` made from `b`; `kc > 0`.
#[allow(clippy::too_many_arguments)]
unsafe fn run(
    isa: SgemmIsa,
    a: &MatOperand,
    packed: &PackedB,
    bias: Option<DevicePtr>,
    act: Activation,
    out: DevicePtr,
    batch: usize,
    m: usize,
    n: usize,
    k: usize,
    kc: usize,
) {
    let (mr, nr) = isa.geometry();
    let panels = n.div_ceil(nr);
    // The kernels read the bias a whole panel at a time: a copy padded with zeros.
    let bias: Option<Vec<f32>> = bias.map(|p| {
        let mut v = vec![0.0f32; panels * nr];
        v[..n].copy_from_slice(super::src(p, n));
        v
    });
    let bias = bias.as_deref();
    let threads = intra_op::pool().map_or(1, |p| p.current_num_threads());
    // Row blocks per product: enough for `units_per_thread` units per thread, none over
    // block_rows.
    let want = (units_per_thread() * threads)
        .div_ceil(batch * panels)
        .max(1);
    // The block that stays in L2 is the rows times one step along k.
    let mb = m
        .div_ceil(want)
        .next_multiple_of(mr)
        .min(block_rows(kc, mr))
        .max(mr);
    let blocks = m.div_ceil(mb);
    let units = batch * blocks * panels;
    let body = |r: std::ops::Range<usize>| {
        for u in r {
            let (bi, rest) = (u / (blocks * panels), u % (blocks * panels));
            let (ib, jp) = (rest / panels, rest % panels);
            let (i0, i1) = (ib * mb, ((ib + 1) * mb).min(m));
            let (j0, cols) = (jp * nr, (n - jp * nr).min(nr));
            let w = packed.panel(jp, nr);
            let bp = bias.map_or(std::ptr::null(), |v| v.as_ptr().add(j0));
            // Steps of kc along k: one step's rows of the panel stay in L1 while the row
            // tiles of the block pass over them; the first step starts from the bias, the
            // later ones from the partial sums, and the last applies the activation.
            let mut p0 = 0;
            while p0 < k {
                let kc = (k - p0).min(kc);
                let (first, last) = (p0 == 0, p0 + kc == k);
                let mut i = i0;
                while i < i1 {
                    let rows = (i1 - i).min(mr);
                    let pa =
                        (a.ptr.0 as *const f32).add(bi * a.batch_stride + i * a.rs + p0 * a.cs);
                    let pc = (out.0 as *mut f32).add(bi * m * n + i * n + j0);
                    // SAFETY: rows i..i + rows < m of a[bi] (columns p0..p0 + kc < k) and
                    // this panel's rows p0..p0 + kc are in bounds; the unit owns rows
                    // i0..i1, columns j0..j0 + cols of out[bi], written by the earlier steps
                    // when `first` is false; the path is available (the caller's contract).
                    let t = Tile {
                        k: kc,
                        a: pa,
                        rs: a.rs,
                        cs: a.cs,
                        w: w.add(p0 * nr),
                        bias: if first { bp } else { std::ptr::null() },
                        accumulate: !first,
                        c: pc,
                        ldc: n,
                        cols,
                        act: if last { act } else { Activation::Identity },
                    };
                    tile(isa, rows, &t);
                    i += rows;
                }
                p0 += kc;
            }
        }
    };
    if guided() {
        intra_op::for_ranges_guided(units, mb * nr * k, 1, body);
    } else {
        intra_op::for_ranges(units, mb * nr * k, body);
    }
}

/// Units of the grid per pool thread that the row blocks are cut for (at least; fewer rows
/// per block than [`block_rows`] when needed): the tunables' `cpu.sgemm_units`
/// (`STREAMPOOL_CPU_SGEMM_UNITS`), default 4.
fn units_per_thread() -> usize {
    crate::config::tuning().cpu.sgemm_units.max(1)
}

/// Whether the units are claimed from a shared counter ([`intra_op::for_ranges_guided`], the
/// default) or split into fixed pieces (`STREAMPOOL_CPU_SGEMM_SCHED=pieces`, the split before,
/// kept to compare).
fn guided() -> bool {
    crate::config::tuning().cpu.sgemm_schedule == SgemmSchedule::Guided
}

/// One register tile's operands: `c[r][j] = act(s[r][j] + sum_p a[r][p] * w[p][j])` for
/// `j < cols`, with `a[r][p]` at `a + r * rs + p * cs`, `w` `k` rows of a packed panel
/// (`NR` floats each), `c` rows `ldc` apart, and `s` the tile's own values of `c` when
/// `accumulate`, else `bias` (`NR` floats) or zeros when it is null.
pub(super) struct Tile {
    pub(super) k: usize,
    pub(super) a: *const f32,
    pub(super) rs: usize,
    pub(super) cs: usize,
    pub(super) w: *const f32,
    pub(super) bias: *const f32,
    pub(super) accumulate: bool,
    pub(super) c: *mut f32,
    pub(super) ldc: usize,
    pub(super) cols: usize,
    pub(super) act: Activation,
}

/// Runs one tile of `rows <= MR` rows on `isa`'s microkernel (one instance per row count,
/// so the accumulators of a short tile stay in registers too).
///
/// # Safety
/// `isa` is available; the tile's pointers are valid for `rows` rows as [`Tile`] says.
unsafe fn tile(isa: SgemmIsa, rows: usize, t: &Tile) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        SgemmIsa::Avx512 => match rows {
            8 => avx512::tile::<8>(t),
            7 => avx512::tile::<7>(t),
            6 => avx512::tile::<6>(t),
            5 => avx512::tile::<5>(t),
            4 => avx512::tile::<4>(t),
            3 => avx512::tile::<3>(t),
            2 => avx512::tile::<2>(t),
            _ => avx512::tile::<1>(t),
        },
        SgemmIsa::Avx2 => match rows {
            6 => avx2::tile::<6>(t),
            5 => avx2::tile::<5>(t),
            4 => avx2::tile::<4>(t),
            3 => avx2::tile::<3>(t),
            2 => avx2::tile::<2>(t),
            _ => avx2::tile::<1>(t),
        },
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, rows, t);
}

/// `act` over a tile row, inlined into the microkernels' `target_feature` functions so the
/// loop vectorizes for them (the tanh GELU stays the `f64` reference form).
#[inline(always)]
pub(super) fn activate_row(y: &mut [f32], act: Activation) {
    match act {
        Activation::Identity => {}
        Activation::Relu => y.iter_mut().for_each(|v| *v = v.max(0.0)),
        Activation::Gelu => y.iter_mut().for_each(|v| *v = super::gelu(*v)),
        Activation::GeluTanh => y.iter_mut().for_each(|v| *v = super::gelu_tanh(*v)),
    }
}
