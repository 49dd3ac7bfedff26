//! Gathers: strided copies and embedding rows.

use super::{grid_for, word, Binder, WORD};
use crate::kernel::{IndexSelect, StridedCopy};
use crate::wgpu::kernels::Which;
use crate::{Error, Result};

impl Binder<'_> {
    pub(super) fn copy(&mut self, p: &StridedCopy) -> Result<()> {
        let (n, elem_size) = (p.len(), p.elem_size);
        if ![2, 4, 8].contains(&elem_size) {
            return Err(Error::InvalidArgument(format!(
                "wgpu copy: unsupported element size {elem_size}"
            )));
        }
        let (sb, so) = self.at(p.src.ptr, 1)?;
        let (ob, oo) = self.at(p.out, WORD)?;
        let mut params = vec![
            elem_size as u32,
            word(n, "length")?,
            p.shape.len() as u32,
            so,
            oo * 4,
        ];
        for d in p.shape.iter().chain(&p.src.strides) {
            params.push(word(*d, "dimension")?);
        }
        let threads = if elem_size == 2 { n.div_ceil(2) } else { n };
        let pipeline = self.pipelines.get(self.shared, Which::Copy, false)?;
        self.dispatch(&pipeline, &params, &[&sb, &ob], grid_for(threads)?)
    }

    pub(super) fn index_select(&mut self, p: &IndexSelect) -> Result<()> {
        let n = p.len();
        let (tb, to) = self.elem(p.table)?;
        let (ib, io) = self.at(p.ids, WORD)?;
        let (ob, oo) = self.elem(p.out)?;
        let params = [
            to,
            io,
            oo,
            word(n, "length")?,
            word(p.row_len, "row length")?,
            // Ids at or past 2^32 are out of range for any table a kernel can bind.
            u32::try_from(p.table_rows).unwrap_or(u32::MAX),
        ];
        let pipeline = self.pipeline(Which::IndexSelect)?;
        self.dispatch(&pipeline, &params, &[&tb, &ib, &ob], grid_for(n)?)
    }
}
