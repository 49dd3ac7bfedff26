//! The fused attention launch: the tiled kernel where the head width allows, else a
//! workgroup per query row.

use super::{grid, word, Binder, WORD};
use crate::kernel::Attention;
use crate::wgpu::kernels::Which;
use crate::{Error, Result};

impl Binder<'_> {
    /// Padded batches only: `prepare` refuses packed ones before this.
    pub(super) fn attention(&mut self, p: &Attention) -> Result<()> {
        let (batch, seq, heads, head_dim) = (p.batch, p.seq, p.heads, p.head_dim);
        let rows = batch * seq * heads;
        if head_dim > 256 {
            return Err(Error::Unavailable(format!(
                "wgpu attention: head width {head_dim} over the kernel's 256"
            )));
        }
        let (qb, qo) = self.elem(p.qkv)?;
        // Without a mask, the kernel reads none: bind any buffer in its place.
        let (mb, mo) = match p.mask {
            Some(m) => self.at(m, WORD)?,
            None => (qb.clone(), 0),
        };
        let (ob, oo) = self.elem(p.out)?;
        let params = [
            qo,
            mo,
            p.mask.is_some() as u32,
            oo,
            word(batch, "batch")?,
            word(seq, "seq")?,
            word(heads, "heads")?,
            word(head_dim, "head width")?,
        ];
        word(rows, "attention rows")?;
        let (which, groups) =
            if self.shared.attention_tiled && head_dim.is_multiple_of(4) && head_dim <= 64 {
                (Which::AttentionTiled, batch * heads * seq.div_ceil(32))
            } else {
                (Which::Attention, rows)
            };
        let pipeline = self.pipeline(which)?;
        self.dispatch(&pipeline, &params, &[&qb, &mb, &ob], grid(groups)?)
    }
}
