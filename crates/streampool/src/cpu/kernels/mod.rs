//! The CPU backend's kernels, one module per family; [`run`] dispatches a [`Kernel`] to them.
//!
//! A stream's worker runs each kernel, handing the pieces of a large one to the intra-op pool
//! ([`super::intra_op`]); inner loops are vectorized for the host's instruction set
//! ([`simd`]). Half kernels run as their `f32` versions on widened copies ([`super::half`]).

mod attention;
pub(crate) mod bf16;
mod elementwise;
mod epilogue;
mod gated;
mod matmul;
mod norm;
mod packed;
mod pool;
mod qgemm;
mod reduce;
mod rms_norm;
mod rope;
pub(crate) mod sgemm;
pub(crate) mod simd;
mod strided;

use crate::backend::DevicePtr;
use crate::kernel::{Kernel, Matmul, MatmulMath};

pub(crate) use qgemm::ARITHMETIC as INT8_ARITHMETIC;

/// # Safety
/// `ptr` is valid for `len` reads of `f32` and nothing writes it meanwhile.
unsafe fn src<'a>(ptr: DevicePtr, len: usize) -> &'a [f32] {
    std::slice::from_raw_parts(ptr.0 as *const f32, len)
}

/// # Safety
/// `ptr` is valid for `len` writes of `f32` and no one else accesses it meanwhile.
unsafe fn dst<'a>(ptr: DevicePtr, len: usize) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut(ptr.0 as *mut f32, len)
}

/// `len` elements of `f32` from element `start` of `ptr`: a task's own piece of an output.
/// Tasks of one kernel take disjoint pieces, so no two `&mut` slices overlap.
///
/// # Safety
/// `ptr` is valid for `start + len` writes of `f32` and no one else accesses this piece.
unsafe fn dst_at<'a>(ptr: DevicePtr, start: usize, len: usize) -> &'a mut [f32] {
    std::slice::from_raw_parts_mut((ptr.0 as *mut f32).add(start), len)
}

/// [`Kernel::Matmul`] on `f32` operands: int8 products where asked, else the weight kept
/// packed where the product carries a slot for it, else packed per call.
///
/// # Safety
/// As [`run`].
unsafe fn matmul_f32(p: &Matmul) {
    let (a, b, slot) = (&p.a, &p.b, p.b_pack.as_ref());
    let (bias, act, out) = (p.bias, p.act, p.out);
    let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
    if p.math == MatmulMath::Int8 {
        return qgemm::matmul(a, b, slot, bias, act, out, batch, m, n, k);
    }
    let prepacked =
        slot.is_some_and(|slot| sgemm::matmul(a, b, slot, bias, act, out, batch, m, n, k));
    if !prepacked {
        matmul::matmul(a, b, bias, act, out, batch, m, n, k);
    }
}

/// Runs one kernel on the calling thread.
///
/// # Safety
/// Every pointer in `kernel` is valid for the extent it describes, outputs do not alias
/// inputs, and no other thread writes those bytes while this runs (the allocator's event
/// gating and the tensor layer's cross-stream waits guarantee it).
pub(crate) unsafe fn run(kernel: &Kernel) {
    // Nothing for an empty kernel: zero-width rows included, which the row kernels cannot
    // take (`chunks_exact(0)` panics).
    if kernel.is_empty() || super::half::run_if_half(kernel) {
        return;
    }
    match kernel {
        Kernel::Cast(_) => unreachable!("conversions run in run_if_half"),
        Kernel::Fill(p) => dst(p.out, p.len).fill(p.value),
        Kernel::Sleep { nanos } => std::thread::sleep(std::time::Duration::from_nanos(*nanos)),
        Kernel::Copy(p) => strided::copy(&p.src, &p.shape, p.out, p.elem_size),
        Kernel::Matmul(p) => matmul_f32(p),
        Kernel::Unary(p) => elementwise::unary(p.op, p.x, p.out, p.len),
        Kernel::Binary(p) => strided::binary(p.op, &p.a, &p.b, &p.shape, p.out),
        Kernel::Softmax(p) => norm::softmax(p.x, p.out, p.rows, p.cols),
        Kernel::LayerNorm(p) => norm::layer_norm(
            p.x, p.residual, p.gamma, p.beta, p.out, p.rows, p.cols, p.eps,
        ),
        Kernel::BiasAct(p) => elementwise::bias_act(p.x, p.bias, p.out, p.rows, p.cols, p.act),
        Kernel::IndexSelect(p) => {
            strided::index_select(p.table, p.ids, p.out, p.n_ids, p.row_len, p.table_rows)
        }
        Kernel::Reduce(p) => reduce::reduce(p.op, p.x, p.out, p.outer, p.axis, p.inner),
        Kernel::Attention(p) => match &p.packed {
            Some(seqs) => {
                packed::attention(p.qkv, seqs, p.out, p.batch, p.seq, p.heads, p.head_dim)
            }
            None => attention::attention(p.qkv, p.mask, p.out, p.batch, p.seq, p.heads, p.head_dim),
        },
        Kernel::MeanPoolNorm(p) => pool::mean_pool_norm(p.x, p.mask, p.out, p.batch, p.seq, p.dim),
        Kernel::RmsNorm(p) => rms_norm::rms_norm(p.x, p.gamma, p.out, p.rows, p.cols, p.eps),
        Kernel::Rope(p) => rope::rope(
            p.x, p.cos, p.sin, p.out, p.batch, p.seq, p.heads, p.head_dim, p.rotated,
        ),
        Kernel::GatedAct(p) => gated::gated_act(p.x, p.out, p.rows, p.cols, p.act),
        Kernel::MeanPoolNormPacked(p) => {
            packed::mean_pool_norm(p.x, &p.seqs, p.out, p.batch, p.dim)
        }
    }
}

/// The path a kind of kernel takes in this process: `forced` if the host has it (a tunable
/// of [`crate::config::CpuTuning`], named `setting` in the warning), else `best` (the best
/// the host has). A forced path the host lacks is warned about. The `f32` products
/// ([`sgemm::cpu_sgemm_isa`]), the `bf16` ones ([`bf16::cpu_bf16_path`]) and attention
/// choose through it.
pub(crate) fn chosen_path<P: Copy>(
    setting: &str,
    forced: Option<P>,
    best: P,
    available: impl Fn(P) -> bool,
    name: impl Fn(P) -> &'static str,
) -> P {
    let Some(forced) = forced else {
        return best;
    };
    if available(forced) {
        return forced;
    }
    tracing::warn!(
        "{setting}={}: not available on this host; using {}",
        name(forced),
        name(best)
    );
    best
}

pub(crate) use epilogue::gelu_tanh;
pub(crate) use simd::gelu;

#[cfg(test)]
mod chosen_path_tests {
    use super::chosen_path;

    /// Unforced, a path the host has, and one it lacks.
    #[test]
    fn a_forced_path_the_host_has_wins_else_the_best() {
        let pick = |forced: Option<usize>| {
            chosen_path(
                "STREAMPOOL_TEST_PATH",
                forced,
                1,
                |p| p != 3,
                |p| ["", "fast", "slow", "missing"][p],
            )
        };
        assert_eq!(pick(None), 1);
        assert_eq!(pick(Some(2)), 2);
        assert_eq!(pick(Some(3)), 1);
    }
}
