//! Launches of the `pool` group: mean pooling, padded and packed.

use super::{Launcher, MAX_BLOCKS, POOL_MAX_DIM, POOL_WARPS};
use crate::kernel::{MeanPoolNorm, MeanPoolNormPacked};
use crate::{Error, Result};

impl Launcher<'_> {
    pub(super) unsafe fn mean_pool_norm(&self, p: MeanPoolNorm) -> Result<()> {
        let (batch, dim) = (p.batch, p.dim);
        let (px, pm, po) = (p.x.0, p.mask.0, p.out.0);
        if let (true, Ok(s32)) = (dim <= POOL_MAX_DIM, i32::try_from(p.seq)) {
            // Rows spread over a block's warps (sp_pool_rows).
            let (b, d, none, tokens) = (batch as u64, dim as u64, 0u64, 0i64);
            return self.go(
                self.module.pool()?.pool_rows.get(p.dtype)?,
                batch.min(MAX_BLOCKS) as u32,
                32 * POOL_WARPS,
                &mut args![px, pm, none, po, b, s32, d, tokens],
            );
        }
        let (b, s, d) = (batch as u64, p.seq as u64, dim as u64);
        self.go_rows(
            self.module.pool()?.mean_pool_norm.get(p.dtype)?,
            batch,
            dim,
            &mut args![px, pm, po, b, s, d],
        )
    }

    pub(super) unsafe fn mean_pool_norm_packed(&self, p: MeanPoolNormPacked) -> Result<()> {
        let (batch, dim, seqs) = (p.batch, p.dim, p.seqs);
        if dim > POOL_MAX_DIM {
            return Err(Error::InvalidArgument(format!(
                "packed mean pooling: rows of {dim} columns, at most {POOL_MAX_DIM}"
            )));
        }
        let (px, poff, po) = (p.x.0, seqs.ptr.0, p.out.0);
        let (none, b, d, tokens) = (0u64, batch as u64, dim as u64, seqs.tokens as i64);
        // Every sequence fits `tokens` rows; no cut.
        let s32 = i32::try_from(seqs.tokens).unwrap_or(i32::MAX);
        self.go(
            self.module.pool()?.pool_rows.get(p.dtype)?,
            batch.min(MAX_BLOCKS) as u32,
            32 * POOL_WARPS,
            &mut args![px, none, poff, po, b, s32, d, tokens],
        )
    }
}
