//! Launches of the kernels that reduce along rows, a workgroup per row or output:
//! reductions, softmax, LayerNorm and mean pooling.

use super::{grid, word, Binder, WORD};
use crate::kernel::{LayerNorm, MeanPoolNorm, Reduce, Softmax};
use crate::wgpu::kernels::Which;
use crate::Result;

impl Binder<'_> {
    pub(super) fn reduce(&mut self, p: &Reduce) -> Result<()> {
        let (xb, xo) = self.elem(p.x)?;
        let (ob, oo) = self.elem(p.out)?;
        let params = [
            p.op.code(),
            xo,
            oo,
            word(p.outer, "outer")?,
            word(p.axis, "axis")?,
            word(p.inner, "inner")?,
        ];
        let pipeline = self.pipeline(Which::Reduce)?;
        self.dispatch(&pipeline, &params, &[&xb, &ob], grid(p.outputs())?)
    }

    pub(super) fn softmax(&mut self, p: &Softmax) -> Result<()> {
        let (xb, xo) = self.elem(p.x)?;
        let (ob, oo) = self.elem(p.out)?;
        let params = [xo, oo, word(p.rows, "rows")?, word(p.cols, "cols")?];
        let pipeline = self.pipeline(Which::Softmax)?;
        self.dispatch(&pipeline, &params, &[&xb, &ob], grid(p.rows)?)
    }

    pub(super) fn layer_norm(&mut self, p: &LayerNorm) -> Result<()> {
        let (xb, xo) = self.elem(p.x)?;
        // Without a residual, `x` is bound in its place and not read.
        let (rb, ro) = match p.residual {
            Some(r) => self.elem(r)?,
            None => (xb.clone(), 0),
        };
        let (gb, go) = self.elem(p.gamma)?;
        let (bb, bo) = self.elem(p.beta)?;
        let (ob, oo) = self.elem(p.out)?;
        let params = [
            xo,
            ro,
            p.residual.is_some() as u32,
            go,
            bo,
            oo,
            word(p.rows, "rows")?,
            word(p.cols, "cols")?,
            p.eps.to_bits(),
        ];
        let pipeline = self.pipeline(Which::LayerNorm)?;
        let buffers = [&xb, &rb, &gb, &bb, &ob];
        self.dispatch(&pipeline, &params, &buffers, grid(p.rows)?)
    }

    /// The mask and the output are `F32` whatever the kernel's dtype.
    pub(super) fn mean_pool_norm(&mut self, p: &MeanPoolNorm) -> Result<()> {
        let (xb, xo) = self.elem(p.x)?;
        let (mb, mo) = self.at(p.mask, WORD)?;
        let (ob, oo) = self.at(p.out, WORD)?;
        let params = [
            xo,
            mo,
            oo,
            word(p.batch, "batch")?,
            word(p.seq, "seq")?,
            word(p.dim, "dim")?,
        ];
        let pipeline = self.pipeline(Which::MeanPoolNorm)?;
        self.dispatch(&pipeline, &params, &[&xb, &mb, &ob], grid(p.batch)?)
    }
}
