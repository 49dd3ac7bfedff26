//! Launches of the `attention` groups: the fused attention, on tensor cores where the head
//! width and dtype allow, else the SIMT kernel.

use super::{aligned16, Launcher, ATTENTION_HEAD_DIMS, ATTENTION_QUERIES, MMA_WARPS};
use crate::kernel::Attention;
use crate::{DType, Error, Result};

impl Launcher<'_> {
    pub(super) unsafe fn attention(&self, p: Attention) -> Result<()> {
        let Attention {
            batch,
            seq,
            heads,
            head_dim,
            dtype,
            ..
        } = p;
        let m = self.module;
        let Some(slot) = ATTENTION_HEAD_DIMS.iter().position(|&w| head_dim <= w) else {
            return Err(Error::InvalidArgument(format!(
                "attention: head width {head_dim} above the CUDA kernel's {}",
                ATTENTION_HEAD_DIMS[3]
            )));
        };
        let too_big =
            |v: usize| Error::InvalidArgument(format!("attention: {v} too large for the kernel"));
        let dim32 = |v: usize| i32::try_from(v).map_err(|_| too_big(v));
        let (s, h, d) = (dim32(seq)?, dim32(heads)?, dim32(head_dim)?);
        let gy = u32::try_from(heads).ok().filter(|&g| g <= 65_535);
        let gz = u32::try_from(batch).ok().filter(|&g| g <= 65_535);
        let (Some(gy), Some(gz)) = (gy, gz) else {
            return Err(too_big(batch.max(heads)));
        };
        let (pq, pm, po) = (p.qkv.0, p.mask.map_or(0, |m| m.0), p.out.0);
        // Packed: the offsets and the token count; the grid is sized by `seq`, the
        // longest sequence, and blocks past their own sequence's end leave at once.
        let (poff, tokens) = p
            .packed
            .map_or((0u64, 0i64), |p| (p.ptr.0, p.tokens as i64));
        let half = match dtype {
            DType::F16 => Some(0),
            DType::BF16 => Some(1),
            _ => None,
        };
        if let (Some(t), true, true) = (
            half,
            m.tensor_cores && ATTENTION_HEAD_DIMS[slot] == head_dim,
            aligned16(&[pq, po]),
        ) {
            // One warp per 16 queries, up to MMA_WARPS per block: the kernels'
            // launch bounds are sized for it (kernels.cu, SP_ATTN_MMA).
            let warps = seq.div_ceil(16).min(MMA_WARPS);
            let gx = seq.div_ceil(16 * warps) as u32;
            return self.go3(
                &m.attention_mma(slot)?[t],
                (gx, gy, gz),
                32 * warps as u32,
                &mut args![pq, pm, poff, po, s, h, tokens],
            );
        }
        let gx = seq.div_ceil(ATTENTION_QUERIES as usize) as u32;
        self.go3(
            m.attention(slot)?.get(dtype)?,
            (gx, gy, gz),
            ATTENTION_QUERIES,
            &mut args![pq, pm, poff, po, s, h, d, tokens],
        )
    }
}
