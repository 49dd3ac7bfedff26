//! Matrix products, through the `gemm` crate (vectorized for the host's instruction set,
//! parallel over the intra-op pool).

use gemm::Parallelism;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;
use crate::kernel::MatOperand;

use super::dst_at;

/// `Kernel::Matmul` in `f32`: `out[b] = a[b] @ b[b] (+ bias)`.
///
/// One large product spreads over the pool inside `gemm`; a batch of small ones (attention
/// scores of the generic path, say) runs one product per pool task instead.
///
/// # Safety
/// The operands are valid for `[batch, m, k]` and `[batch, k, n]` under their strides, `out`
/// for `batch * m * n` writes and `bias` for `n` reads; `out` aliases neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn matmul(
    a: &MatOperand,
    b: &MatOperand,
    bias: Option<DevicePtr>,
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
    // The bias goes in first and the GEMM accumulates onto it (`read_dst`): no second pass.
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
    if k == 0 {
        return;
    }
    let read_dst = bias.is_some();
    let product = |bi: usize, par: Parallelism| {
        let pa = (a.ptr.0 as *const f32).add(bi * a.batch_stride);
        let pb = (b.ptr.0 as *const f32).add(bi * b.batch_stride);
        let pc = (out.0 as *mut f32).add(bi * m * n);
        // dst = 1 * dst + 1 * (a @ b) when read_dst, else a @ b. Strides are (col, row).
        gemm::gemm(
            m,
            n,
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
    let per_product = m.saturating_mul(n).saturating_mul(k);
    if batch > 1 && per_product < gemm::get_threading_threshold() {
        // Products too small for `gemm` to split: one per task. Sending raw pointers across
        // threads is sound because every task writes its own `out[bi]` block only.
        let product = &product;
        intra_op::for_ranges(batch, per_product, |r| {
            for bi in r {
                product(bi, Parallelism::None);
            }
        });
    } else {
        intra_op::run(per_product.saturating_mul(batch), || {
            let par = match intra_op::pool() {
                Some(_) if rayon::current_thread_index().is_some() => Parallelism::Rayon(0),
                _ => Parallelism::None,
            };
            for bi in 0..batch {
                product(bi, par);
            }
        });
    }
}
