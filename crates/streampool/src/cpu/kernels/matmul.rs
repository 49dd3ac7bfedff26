//! Matrix products through the `gemm` crate (vectorized for the host's instruction set,
//! parallel over the intra-op pool): the products [`super::sgemm`] leaves (operands without
//! a weight slot, batches of distinct matrices, hosts without AVX2).

use std::ops::Range;

use gemm::Parallelism;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::{Activation, MatOperand};

use super::{dst_at, epilogue};

/// `Kernel::Matmul` in `f32`: `out[b] = act(a[b] @ b[b] (+ bias))`.
///
/// A large product is cut into a grid of tiles, each a single-threaded `gemm` call on a
/// pool thread that also writes its block's bias first (the GEMM accumulates onto it) and
/// applies the activation to its block after: one pass over the output. A batch of small
/// products (attention scores of the generic path, say) runs one product per pool task
/// instead, with the bias and the activation as passes of their own.
///
/// # Safety
/// The operands are valid for `[batch, m, k]` and `[batch, k, n]` under their strides, `out`
/// for `batch * m * n` writes and `bias` for `n` reads; `out` aliases neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
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
    let rows = batch * m;
    let per_product = m.saturating_mul(n).saturating_mul(k);
    let threads = intra_op::pool().map_or(1, |p| p.current_num_threads());
    let split =
        k > 0 && per_product >= gemm::get_threading_threshold() && threads > 1 && !gemm_threads();
    if !split {
        // The bias goes in first and the GEMM accumulates onto it (`read_dst`).
        match bias {
            Some(bias) => {
                let bias = super::src(bias, n);
                intra_op::for_ranges(rows, n, |r| {
                    for row in dst_at(out, r.start * n, r.len() * n).chunks_exact_mut(n) {
                        row.copy_from_slice(bias);
                    }
                });
            }
            // `gemm` with k == 0 and `read_dst` off leaves the output alone: zero it ourselves.
            None if k == 0 => {
                intra_op::for_ranges(rows, n, |r| dst_at(out, r.start * n, r.len() * n).fill(0.0))
            }
            None => {}
        }
    }
    let read_dst = bias.is_some();
    // One tile of one product: rows `i` x columns `j` of `out[bi]`, single-threaded in `gemm`
    // (packing and its vectorized microkernel) or spread by `gemm` itself.
    let tile = |bi: usize, i: Range<usize>, j: Range<usize>, par: Parallelism| {
        let pa = (a.ptr.0 as *const f32).add(bi * a.batch_stride + i.start * a.rs);
        let pb = (b.ptr.0 as *const f32).add(bi * b.batch_stride + j.start * b.cs);
        let pc = (out.0 as *mut f32).add(bi * m * n + i.start * n + j.start);
        // dst = 1 * dst + 1 * (a @ b) when read_dst, else a @ b. Strides are (col, row).
        gemm::gemm(
            i.len(),
            j.len(),
            k,
            pc,
            1,
            n as isize,
            read_dst,
            pa,
            a.cs as isize,
            a.rs as isize,
            pb,
            b.cs as isize,
            b.rs as isize,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    };
    if k > 0 && !split && (per_product < gemm::get_threading_threshold() || threads == 1) {
        // Products too small to split (or no pool): one per task, if there are several.
        // Sending raw pointers across threads is sound: every task writes its own
        // `out[bi]` block only.
        let tile = &tile;
        intra_op::for_ranges(batch, per_product, |r| {
            for bi in r {
                tile(bi, 0..m, 0..n, Parallelism::None);
            }
        });
    } else if k > 0 && !split {
        intra_op::run(usize::MAX, || {
            for bi in 0..batch {
                tile(bi, 0..m, 0..n, Parallelism::Rayon(0));
            }
        });
    }
    if !split {
        epilogue::apply(out, rows * n, act);
        return;
    }
    // Our own split: a grid of tiles, each a single-threaded `gemm`, a few per pool thread,
    // each writing its block's bias before and its activation after. Rows split first (each
    // tile packs its own slice of `b`, a cost of one row block per tile: small against the
    // tile's product); columns once rows run out (a batch-1 forward has 32 rows).
    // On a 16-core Xeon this grid ran MiniLM's forward at 271 / 981 sentences/s (32 tokens,
    // batch 1 / 64) where `gemm`'s own rayon split ran it at 215 / 792.
    let bias = bias.map(|p| super::src(p, n));
    let (per_thread, min_rows) = tiling();
    let (pm, pn) = grid(m, n, per_thread * threads, min_rows);
    let (bm, bn) = (m.div_ceil(pm), n.div_ceil(pn));
    let tiles = batch * pm * pn;
    let tile = &tile;
    intra_op::for_ranges(tiles, per_product / (pm * pn), |r| {
        for t in r {
            let (bi, rest) = (t / (pm * pn), t % (pm * pn));
            let (ti, tj) = (rest / pn, rest % pn);
            let i = ti * bm..((ti + 1) * bm).min(m);
            let j = tj * bn..((tj + 1) * bn).min(n);
            if i.is_empty() || j.is_empty() {
                continue;
            }
            // The block's rows: each task owns its (bi, i, j) block of `out`.
            let row = |r: usize| dst_at(out, bi * m * n + r * n + j.start, j.len());
            if let Some(bias) = bias {
                for r in i.clone() {
                    row(r).copy_from_slice(&bias[j.clone()]);
                }
            }
            tile(bi, i.clone(), j.clone(), Parallelism::None);
            if act != Activation::Identity {
                for r in i.clone() {
                    epilogue::apply_piece(row(r), act);
                }
            }
        }
    });
}

/// Row and column blocks for about `tasks` tiles of an `m x n` product: rows in blocks of at
/// least `min_rows`, then columns in blocks of at least 64 (narrower tiles waste `gemm`'s
/// register-blocked microkernel).
fn grid(m: usize, n: usize, tasks: usize, min_rows: usize) -> (usize, usize) {
    let pm = m.div_ceil(min_rows.max(1)).clamp(1, tasks.max(1));
    let pn = (tasks / pm).clamp(1, n.div_ceil(64).max(1));
    (pm, pn)
}

/// Tiles per pool thread and the fewest rows per tile: 4 and 32 (the best of six settings
/// swept on a 16-core Xeon with MiniLM's forward) unless the tunables' `cpu.gemm_tiles`
/// (`STREAMPOOL_CPU_GEMM_TILES=PER_THREAD,MIN_ROWS`) says otherwise (a tuning knob for new
/// hosts; `scripts/device/run.sh cpu` with it set compares a setting against PyTorch).
fn tiling() -> (usize, usize) {
    let (per_thread, min_rows) = crate::config::tuning().cpu.gemm_tiles;
    (per_thread.max(1), min_rows.max(1))
}

/// `STREAMPOOL_CPU_GEMM=gemm` (the tunables' `cpu.gemm_split`): large products split by the
/// `gemm` crate's own rayon code instead of our grid of single-threaded tiles (kept to
/// compare the two on new hosts).
fn gemm_threads() -> bool {
    crate::config::tuning().cpu.gemm_split == crate::config::GemmSplit::Gemm
}
