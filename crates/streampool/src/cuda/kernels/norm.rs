//! Launches of the `norm` group: layer and RMS norms.

use super::{aligned16, ln_vec8, Launcher, LN_GROUPS, LN_ROWS_PER_BLOCK, MAX_BLOCKS};
use crate::kernel::{LayerNorm, RmsNorm};
use crate::{DType, Result};

impl Launcher<'_> {
    /// Half rows of whole 16-byte chunks take `sp_layer_norm_vec8`, rows the warp-per-row
    /// kernel can hold take it, every other the block-per-row kernel.
    pub(super) unsafe fn layer_norm(&self, p: LayerNorm) -> Result<()> {
        let (rows, cols, eps) = (p.rows, p.cols, p.eps);
        let (px, pr, pg, pb, po) = (
            p.x.0,
            p.residual.map_or(0, |r| r.0),
            p.gamma.0,
            p.beta.0,
            p.out.0,
        );
        let (r, c) = (rows as u64, cols as u64);
        let half = match p.dtype {
            DType::F16 => Some(0),
            DType::BF16 => Some(1),
            _ => None,
        };
        let norm = || self.module.norm();
        if let (Some(t), 0, true, true) = (
            half,
            cols % 8,
            cols <= 16 * 8 * 8 && ln_vec8(),
            aligned16(&[px, pr, pg, pb, po]),
        ) {
            let g = usize::from(cols > 16 * 8 * 4);
            return self.go(
                &norm()?.layer_norm_vec8[g][t],
                rows.div_ceil(2 * LN_ROWS_PER_BLOCK).min(MAX_BLOCKS) as u32,
                32 * LN_ROWS_PER_BLOCK as u32,
                &mut args![px, pr, pg, pb, po, r, c, eps],
            );
        }
        if cols % 4 == 0 && cols <= 4 * 32 * LN_GROUPS && aligned16(&[px, pr, pg, pb, po]) {
            return self.go(
                norm()?.layer_norm_warp.get(p.dtype)?,
                rows.div_ceil(LN_ROWS_PER_BLOCK).min(MAX_BLOCKS) as u32,
                32 * LN_ROWS_PER_BLOCK as u32,
                &mut args![px, pr, pg, pb, po, r, c, eps],
            );
        }
        self.go_rows(
            norm()?.layer_norm.get(p.dtype)?,
            rows,
            cols,
            &mut args![px, pr, pg, pb, po, r, c, eps],
        )
    }

    pub(super) unsafe fn rms_norm(&self, p: RmsNorm) -> Result<()> {
        let (px, pg, po, r, c) = (p.x.0, p.gamma.0, p.out.0, p.rows as u64, p.cols as u64);
        let eps = p.eps;
        self.go_rows(
            self.module.norm()?.rms_norm.get(p.dtype)?,
            p.rows,
            p.cols,
            &mut args![px, pg, po, r, c, eps],
        )
    }
}
