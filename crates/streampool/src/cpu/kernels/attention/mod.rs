//! Fused multi-head self-attention over a packed QKV projection.
//!
//! Two paths per (sequence, head) pair, one pool task per run of pairs:
//!
//! | path | when | products | softmax |
//! |---|---|---|---|
//! | [`avx512`] (default where it applies) | AVX-512F, head width a multiple of 16, sequence up to [`avx512::MAX_SEQ`] | register tiles of our own | in registers |
//! | `gemm` (`STREAMPOOL_CPU_ATTENTION=gemm`, and every other case) | any | two single-threaded `gemm` crate calls | vectorized loops |
//!
//! On the 16-core Xeon at MiniLM's 32 tokens (batch 64, 12 heads of 32) the `gemm` path ran
//! at about 140 GFLOP/s (`bench/results/cpu-forward/`): per pair, `gemm`'s dispatch
//! and a softmax whose masked maximum and `exp` stayed scalar outweighed the arithmetic.

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

use std::sync::OnceLock;

use crate::backend::DevicePtr;
use crate::cpu::intra_op;

use super::simd::{self, multiversion};
use super::src;

/// Whether pairs may take the [`avx512`] path in this process: the host has it and the
/// tunables' `cpu.attention` (`STREAMPOOL_CPU_ATTENTION`) does not say `gemm` (shapes
/// decide per call).
fn avx512_allowed() -> bool {
    static ALLOWED: OnceLock<bool> = OnceLock::new();
    *ALLOWED.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        let best = avx512::host_has();
        #[cfg(not(target_arch = "x86_64"))]
        let best = false;
        let forced = crate::config::tuning()
            .cpu
            .attention
            .map(|p| p == crate::config::CpuAttentionPath::Avx512);
        super::chosen_path(
            crate::config::CPU_ATTENTION_ENV,
            forced,
            best,
            |p| !p || best,
            |p| if p { "avx512" } else { "gemm" },
        )
    })
}

/// `Kernel::Attention` in `f32`: one pool task per run of (sequence, head) pairs, each on
/// the [`avx512`] path where it applies, else on `gemm` calls ([`pair`]).
///
/// # Safety
/// `qkv` is valid for `batch * seq * 3 * heads * head_dim` reads, `mask` for `batch * seq`,
/// `out` for `batch * seq * heads * head_dim` writes.
pub(super) unsafe fn attention(
    qkv: DevicePtr,
    mask: Option<DevicePtr>,
    out: DevicePtr,
    batch: usize,
    seq: usize,
    heads: usize,
    d: usize,
) {
    if seq == 0 || d == 0 {
        return;
    }
    let mask = mask.map(|m| src(m, batch * seq));
    #[cfg(target_arch = "x86_64")]
    if avx512_allowed() && avx512::applies(seq, d) {
        let hidden = heads * d;
        let (kt_len, s_len) = avx512::scratch_len(seq, d);
        intra_op::for_ranges(batch * heads, 4 * seq * seq * d, |r| {
            let (mut kt, mut s) = (vec![0.0f32; kt_len], vec![0.0f32; s_len]);
            for item in r {
                let (b, h) = (item / heads, item % heads);
                let base = (qkv.0 as *const f32).add(b * seq * 3 * hidden + h * d);
                let p = avx512::Pair {
                    q: base,
                    k: base.add(hidden),
                    v: base.add(2 * hidden),
                    width: 3 * hidden,
                    out: (out.0 as *mut f32).add(b * seq * hidden + h * d),
                    ldo: hidden,
                    seq,
                    d,
                    keep: mask.map(|m| &m[b * seq..(b + 1) * seq]),
                };
                // SAFETY: the path applies (checked above); the pair's rows are in bounds
                // (the caller's contract) and its output columns are this item's alone.
                avx512::pair(&p, &mut kt, &mut s);
            }
        });
        return;
    }
    intra_op::for_ranges(batch * heads, 4 * seq * seq * d, |r| {
        let mut scores = vec![0.0f32; seq * seq];
        let mut keep = vec![0.0f32; seq];
        for item in r {
            let (b, h) = (item / heads, item % heads);
            pair(qkv, mask, out, b, h, seq, heads, d, &mut scores, &mut keep);
        }
    });
}

/// One (sequence `b`, head `h`) pair of [`attention`].
///
/// # Safety
/// As for [`attention`]; no other task writes this pair's outputs.
#[allow(clippy::too_many_arguments)]
unsafe fn pair(
    qkv: DevicePtr,
    mask: Option<&[f32]>,
    out: DevicePtr,
    b: usize,
    h: usize,
    seq: usize,
    heads: usize,
    d: usize,
    scores: &mut [f32],
    keep: &mut [f32],
) {
    let hidden = heads * d;
    let width = 3 * hidden as isize;
    let base = (qkv.0 as *const f32).add(b * seq * 3 * hidden);
    let (q, k, v) = (
        base.add(h * d),
        base.add(hidden + h * d),
        base.add(2 * hidden + h * d),
    );
    // scores[i, j] = q_i . k_j: lhs q [seq, d] (row stride width), rhs k^T [d, seq] (element
    // (c, j) at k + j * width + c). `gemm`'s strides are (column, row).
    gemm::gemm(
        seq,
        seq,
        d,
        scores.as_mut_ptr(),
        1,
        seq as isize,
        false,
        q,
        1,
        width,
        k,
        width,
        1,
        0.0f32,
        1.0f32,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
    // 1 for keys that count, 0 for padding; every key when all are padding (a uniform row,
    // as Hugging Face's additive `f32::MIN` mask gives).
    let any = match mask {
        Some(m) => {
            let m = &m[b * seq..(b + 1) * seq];
            keep.iter_mut()
                .zip(m)
                .for_each(|(k, &m)| *k = if m == 0.0 { 0.0 } else { 1.0 });
            m.iter().any(|&m| m != 0.0)
        }
        None => {
            keep.fill(1.0);
            true
        }
    };
    if any {
        masked_softmax(scores, keep);
    } else {
        scores.fill(1.0 / seq as f32);
    }
    // out[i, h] = sum_j p[i, j] v_j, written in place into the output rows (stride hidden).
    gemm::gemm(
        seq,
        d,
        seq,
        (out.0 as *mut f32).add(b * seq * hidden + h * d),
        1,
        hidden as isize,
        false,
        scores.as_ptr(),
        1,
        seq as isize,
        v,
        1,
        width,
        0.0f32,
        1.0f32,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
}

multiversion! {
    /// Softmax of every row of the `[seq, seq]` block over the keys with `keep[j] == 1`
    /// (padding keys get exactly 0; `keep` has at least one 1).
    unsafe fn masked_softmax(scores: &mut [f32], keep: &[f32]) {
        for row in scores.chunks_exact_mut(keep.len()) {
            simd::softmax_in_place(row, Some(keep));
        }
    }
}
