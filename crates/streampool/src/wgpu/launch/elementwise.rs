//! Element-wise launches: fills, casts, unary and binary functions, bias and activation.

use super::{grid_for, storage_half, word, Binder};
use crate::kernel::{BiasAct, Binary, Cast, Fill, Kernel, Unary, UnaryOp};
use crate::wgpu::kernels::Which;
use crate::{DType, Error, Result};

impl Binder<'_> {
    pub(super) fn fill(&mut self, p: &Fill) -> Result<()> {
        let (ob, oo) = self.elem(p.out)?;
        let params = [oo, word(p.len, "length")?, p.value.to_bits()];
        let pipeline = self.pipeline(Which::Fill)?;
        self.dispatch(&pipeline, &params, &[&ob], grid_for(p.len)?)
    }

    /// `kernel` (this cast) names the operation in the errors.
    pub(super) fn cast(&mut self, kernel: &Kernel, p: &Cast) -> Result<()> {
        let (from, to) = (p.from, p.to);
        let which = match (from, to) {
            (DType::F32, DType::F16) => Which::CastToHalf,
            (DType::F16, DType::F32) => Which::CastToSingle,
            _ => {
                // Names the dtype WGSL lacks (or the missing SHADER_F16).
                let odd = if from == DType::F32 { to } else { from };
                storage_half(self.shared, kernel, odd)?;
                return Err(Error::Unavailable(format!(
                    "wgpu backend: cast from {from:?} to {to:?}"
                )));
            }
        };
        storage_half(self.shared, kernel, DType::F16)?;
        let (xb, xo) = self.at(p.x, from.size() as u64)?;
        let (ob, oo) = self.at(p.out, to.size() as u64)?;
        let params = [xo, oo, word(p.len, "length")?];
        let pipeline = self.pipelines.get(self.shared, which, true)?;
        self.dispatch(&pipeline, &params, &[&xb, &ob], grid_for(p.len)?)
    }

    pub(super) fn unary(&mut self, p: &Unary) -> Result<()> {
        let (xb, xo) = self.elem(p.x)?;
        let (ob, oo) = self.elem(p.out)?;
        let (mul, add) = match p.op {
            UnaryOp::Affine { mul, add } => (mul, add),
            _ => (0.0, 0.0),
        };
        let params = [
            p.op.code(),
            xo,
            oo,
            word(p.len, "length")?,
            mul.to_bits(),
            add.to_bits(),
        ];
        let pipeline = self.pipeline(Which::Unary)?;
        self.dispatch(&pipeline, &params, &[&xb, &ob], grid_for(p.len)?)
    }

    pub(super) fn binary(&mut self, p: &Binary) -> Result<()> {
        let n = p.len();
        let (ab, ao) = self.elem(p.a.ptr)?;
        let (bb, bo) = self.elem(p.b.ptr)?;
        let (ob, oo) = self.elem(p.out)?;
        let mut params = vec![
            p.op.code(),
            word(n, "length")?,
            p.shape.len() as u32,
            ao,
            bo,
            oo,
        ];
        for d in p.shape.iter().chain(&p.a.strides).chain(&p.b.strides) {
            params.push(word(*d, "dimension")?);
        }
        let pipeline = self.pipeline(Which::Binary)?;
        self.dispatch(&pipeline, &params, &[&ab, &bb, &ob], grid_for(n)?)
    }

    pub(super) fn bias_act(&mut self, p: &BiasAct) -> Result<()> {
        let n = p.len();
        let (xb, xo) = self.elem(p.x)?;
        let (bb, bo) = self.elem(p.bias)?;
        let (ob, oo) = self.elem(p.out)?;
        let params = [
            xo,
            bo,
            oo,
            word(n, "length")?,
            word(p.cols, "cols")?,
            p.act.code(),
        ];
        let pipeline = self.pipeline(Which::BiasAct)?;
        self.dispatch(&pipeline, &params, &[&xb, &bb, &ob], grid_for(n)?)
    }
}
