//! The matmul launch: the kernel `choice.rs` picks for the shape (16x16 tiles, the
//! matrix-vector kernel, the register-blocked or the cooperative-matrix one) in the operand
//! layout chosen here, in dispatches of at most 65,535 batches.

use super::{word, Binder, Taken, MAX_GROUPS};
use crate::kernel::Matmul;
use crate::sync::Arc;
use crate::wgpu::choice::{gemv_lanes, matmul_kernel, MatmulPath};
use crate::wgpu::kernels::{Pipeline, Which};
use crate::wgpu::{blocked, coop};
use crate::{Error, Result};

/// The layout of the blocked and cooperative kernels: the vec4 variants need every offset,
/// stride and extent they step by four to be a multiple of four (in elements). `ao`, `bo`
/// and `oo` are the operands' and the output's offsets.
fn layout(p: &Matmul, [ao, bo, oo]: [u32; 3]) -> blocked::Layout {
    let (a, b) = (&p.a, &p.b);
    let four = |v: &[usize]| v.iter().all(|x| x.is_multiple_of(4));
    let common = a.cs == 1
        && four(&[ao as usize, a.rs, a.batch_stride, p.k, p.n, oo as usize])
        && four(&[bo as usize, b.batch_stride]);
    if common && b.rs == 1 && b.cs != 1 && b.cs.is_multiple_of(4) {
        blocked::Layout::AlongK
    } else if common && b.cs == 1 && b.rs.is_multiple_of(4) {
        blocked::Layout::BAlongN
    } else {
        blocked::Layout::Generic
    }
}

impl Binder<'_> {
    pub(super) fn matmul(&mut self, p: &Matmul) -> Result<()> {
        let (a, b) = (&p.a, &p.b);
        let (batch, m, n, k) = (p.batch, p.m, p.n, p.k);
        let (ab, ao) = self.elem(a.ptr)?;
        let (bb, bo) = self.elem(b.ptr)?;
        let (ob, oo) = self.elem(p.out)?;
        // The epilogue's bias (without one, `a` is bound in its place and not read).
        let (biasb, biaso) = match p.bias {
            Some(ptr) => self.elem(ptr)?,
            None => (ab.clone(), 0),
        };
        let path = matmul_kernel(&self.shared.matmul, self.half, batch, m, k, n);
        let gemv_lanes = gemv_lanes(batch, n, k);
        let layout = layout(p, [ao, bo, oo]);
        let (pipeline, [bm, bn]) = self.matmul_pipeline(path, gemv_lanes, layout)?;
        let tiles = [
            word(n.div_ceil(bn), "columns")?,
            word(m.div_ceil(bm), "rows")?,
        ];
        if tiles[0] > MAX_GROUPS || tiles[1] > MAX_GROUPS {
            return Err(Error::InvalidArgument(format!(
                "wgpu matmul: {m}x{n} output exceeds the dispatch limit"
            )));
        }
        // Batches beyond one dispatch's z range go in further dispatches.
        for first in (0..batch).step_by(MAX_GROUPS as usize) {
            let count = (batch - first).min(MAX_GROUPS as usize) as u32;
            let params = [
                word(m, "m")?,
                word(n, "n")?,
                word(k, "k")?,
                word(first, "batch")?,
                ao,
                word(a.batch_stride, "stride")?,
                word(a.rs, "stride")?,
                word(a.cs, "stride")?,
                bo,
                word(b.batch_stride, "stride")?,
                word(b.rs, "stride")?,
                word(b.cs, "stride")?,
                oo,
                biaso,
                p.act.code(),
                p.bias.is_some() as u32,
                gemv_lanes as u32,
            ];
            self.dispatch(
                &pipeline,
                &params,
                &[&ab, &bb, &ob, &biasb],
                [tiles[0], tiles[1], count],
            )?;
        }
        Ok(())
    }

    /// The pipeline of `path` and its block tile `[rows, columns]`; notes the kernel taken
    /// for the profile. `layout`: the operands' layout, for the blocked and cooperative
    /// kernels.
    fn matmul_pipeline(
        &mut self,
        path: MatmulPath,
        gemv_lanes: usize,
        layout: blocked::Layout,
    ) -> Result<(Arc<Pipeline>, [usize; 2])> {
        self.matmul = Some(Taken::Other(path));
        Ok(match path {
            MatmulPath::Simple => (self.pipeline(Which::Matmul)?, [16, 16]),
            // One row; 256 / lanes columns per workgroup.
            MatmulPath::Gemv => (self.pipeline(Which::Gemv)?, [1, 256 / gemv_lanes]),
            MatmulPath::Coop { bm, bn, bk } => {
                let spec = coop::Spec {
                    bm,
                    bn,
                    bk,
                    layout,
                    emulate: self.shared.matmul.coop.is_some_and(|c| c.emulate),
                };
                self.matmul = Some(Taken::Coop(spec));
                let pipeline = self.pipelines.coop(self.shared, spec)?;
                (pipeline, [bm as usize, bn as usize])
            }
            MatmulPath::Blocked { bm, bn, bk } => {
                let spec = blocked::Spec { bm, bn, bk, layout };
                self.matmul = Some(Taken::Blocked(spec));
                let pipeline = self.pipelines.blocked(self.shared, spec, self.half)?;
                (pipeline, [bm as usize, bn as usize])
            }
        })
    }
}
