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
use crate::kernel::{Kernel, MatmulMath};

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

/// Runs one kernel on the calling thread.
///
/// # Safety
/// Every pointer in `kernel` is valid for the extent it describes, outputs do not alias
/// inputs, and no other thread writes those bytes while this runs (the allocator's event
/// gating and the tensor layer's cross-stream waits guarantee it).
pub(crate) unsafe fn run(kernel: &Kernel) {
    if super::half::run_if_half(kernel) {
        return;
    }
    match kernel {
        Kernel::Cast { .. } => unreachable!("conversions run in run_if_half"),
        Kernel::Fill {
            out, len, value, ..
        } => dst(*out, *len).fill(*value),
        Kernel::Sleep { nanos } => std::thread::sleep(std::time::Duration::from_nanos(*nanos)),
        Kernel::Copy {
            src: s,
            shape,
            out,
            elem_size,
        } => strided::copy(s, shape, *out, *elem_size),
        Kernel::Matmul {
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
            math: MatmulMath::Int8,
            ..
        } => qgemm::matmul(a, b, b_pack.as_ref(), *bias, *act, *out, *batch, *m, *n, *k),
        Kernel::Matmul {
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
            ..
        } => {
            let prepacked = b_pack.as_ref().is_some_and(|slot| {
                sgemm::matmul(a, b, slot, *bias, *act, *out, *batch, *m, *n, *k)
            });
            if !prepacked {
                matmul::matmul(a, b, *bias, *act, *out, *batch, *m, *n, *k);
            }
        }
        Kernel::Unary {
            op, x, out, len, ..
        } => elementwise::unary(*op, *x, *out, *len),
        Kernel::Binary {
            op,
            a,
            b,
            shape,
            out,
            ..
        } => strided::binary(*op, a, b, shape, *out),
        // Zero-width rows have nothing to compute (and `chunks_exact(0)` panics).
        Kernel::Softmax { cols: 0, .. } | Kernel::BiasAct { cols: 0, .. } => {}
        Kernel::IndexSelect { row_len: 0, .. } => {}
        Kernel::RmsNorm { cols: 0, .. } | Kernel::GatedAct { cols: 0, .. } => {}
        Kernel::Rope { head_dim: 0, .. } => {}
        Kernel::Softmax {
            x, out, rows, cols, ..
        } => norm::softmax(*x, *out, *rows, *cols),
        Kernel::LayerNorm {
            x,
            residual,
            gamma,
            beta,
            out,
            rows,
            cols,
            eps,
            ..
        } => norm::layer_norm(*x, *residual, *gamma, *beta, *out, *rows, *cols, *eps),
        Kernel::BiasAct {
            x,
            bias,
            out,
            rows,
            cols,
            act,
            ..
        } => elementwise::bias_act(*x, *bias, *out, *rows, *cols, *act),
        Kernel::IndexSelect {
            table,
            ids,
            out,
            n_ids,
            row_len,
            table_rows,
            ..
        } => strided::index_select(*table, *ids, *out, *n_ids, *row_len, *table_rows),
        Kernel::Reduce {
            op,
            x,
            out,
            outer,
            axis,
            inner,
            ..
        } => reduce::reduce(*op, *x, *out, *outer, *axis, *inner),
        Kernel::Attention {
            qkv,
            packed: Some(seqs),
            out,
            batch,
            seq,
            heads,
            head_dim,
            ..
        } => packed::attention(*qkv, seqs, *out, *batch, *seq, *heads, *head_dim),
        Kernel::Attention {
            qkv,
            mask,
            out,
            batch,
            seq,
            heads,
            head_dim,
            ..
        } => attention::attention(*qkv, *mask, *out, *batch, *seq, *heads, *head_dim),
        Kernel::MeanPoolNorm {
            x,
            mask,
            out,
            batch,
            seq,
            dim,
            ..
        } => pool::mean_pool_norm(*x, *mask, *out, *batch, *seq, *dim),
        Kernel::RmsNorm {
            x,
            gamma,
            out,
            rows,
            cols,
            eps,
            ..
        } => rms_norm::rms_norm(*x, *gamma, *out, *rows, *cols, *eps),
        Kernel::Rope {
            x,
            cos,
            sin,
            out,
            batch,
            seq,
            heads,
            head_dim,
            rotated,
            ..
        } => rope::rope(
            *x, *cos, *sin, *out, *batch, *seq, *heads, *head_dim, *rotated,
        ),
        Kernel::GatedAct {
            x,
            out,
            rows,
            cols,
            act,
            ..
        } => gated::gated_act(*x, *out, *rows, *cols, *act),
        Kernel::MeanPoolNormPacked {
            x,
            seqs,
            out,
            batch,
            dim,
            ..
        } => packed::mean_pool_norm(*x, seqs, *out, *batch, *dim),
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
