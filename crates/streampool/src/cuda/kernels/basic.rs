//! Launches of the `basic` group: fills, casts, copies, element-wise ops, gathers,
//! reductions, softmax, and the test-only sleep.

use super::{aligned16, dims, dtype_code, grid, Launcher, THREADS};
use crate::kernel::{
    Binary, Cast, Fill, IndexSelect, Reduce, Softmax, StridedCopy, Unary, UnaryOp,
};
use crate::{Error, Result};

impl Launcher<'_> {
    pub(super) unsafe fn fill(&self, p: Fill) -> Result<()> {
        let (o, n, value) = (p.out.0, p.len as u64, p.value);
        self.go(
            self.module.basic()?.fill.get(p.dtype)?,
            grid(p.len),
            THREADS,
            &mut args![o, n, value],
        )
    }

    pub(super) unsafe fn cast(&self, p: Cast) -> Result<()> {
        let (cf, ct) = (dtype_code(p.from)?, dtype_code(p.to)?);
        let (px, po, n) = (p.x.0, p.out.0, p.len as u64);
        self.go(
            &self.module.basic()?.cast,
            grid(p.len),
            THREADS,
            &mut args![cf, ct, px, po, n],
        )
    }

    pub(super) unsafe fn sleep(&self, nanos: u64) -> Result<()> {
        self.go(&self.module.basic()?.sleep, 1, 1, &mut args![nanos])
    }

    pub(super) unsafe fn copy(&self, p: StridedCopy) -> Result<()> {
        let n = p.len();
        let m = self.module;
        let f = match p.elem_size {
            2 => &m.basic()?.copy[0],
            4 => &m.basic()?.copy[1],
            8 => &m.basic()?.copy[2],
            other => {
                return Err(Error::InvalidArgument(format!(
                    "copy kernel: unsupported element size {other}"
                )))
            }
        };
        let d = dims(&p.shape, &p.src, &p.src, self.device)?;
        let (s, o, n64) = (p.src.ptr.0, p.out.0, n as u64);
        self.go(f, grid(n), THREADS, &mut args![s, o, n64, d])
    }

    pub(super) unsafe fn unary(&self, p: Unary) -> Result<()> {
        let code = p.op.code() as i32;
        let (mul, add): (f32, f32) = match p.op {
            UnaryOp::Affine { mul, add } => (mul, add),
            _ => (1.0, 0.0),
        };
        let (px, po, n) = (p.x.0, p.out.0, p.len as u64);
        self.go(
            self.module.basic()?.unary.get(p.dtype)?,
            grid(p.len),
            THREADS,
            &mut args![code, px, po, n, mul, add],
        )
    }

    pub(super) unsafe fn binary(&self, p: Binary) -> Result<()> {
        let n = p.len();
        let code = p.op.code() as i32;
        let d = dims(&p.shape, &p.a, &p.b, self.device)?;
        // Dense operands (the common case) skip the index arithmetic.
        let dense = d.rank <= 1 && d.sa[0] == 1 && d.sb[0] == 1;
        let contiguous: i32 = dense as i32;
        let (pa, pb, po, n64) = (p.a.ptr.0, p.b.ptr.0, p.out.0, n as u64);
        self.go(
            self.module.basic()?.binary.get(p.dtype)?,
            grid(n),
            THREADS,
            &mut args![code, pa, pb, po, n64, contiguous, d],
        )
    }

    pub(super) unsafe fn softmax(&self, p: Softmax) -> Result<()> {
        let (px, po, r, c) = (p.x.0, p.out.0, p.rows as u64, p.cols as u64);
        self.go_rows(
            self.module.basic()?.softmax.get(p.dtype)?,
            p.rows,
            p.cols,
            &mut args![px, po, r, c],
        )
    }

    pub(super) unsafe fn index_select(&self, p: IndexSelect) -> Result<()> {
        let n = p.len();
        let (pt, pi, po) = (p.table.0, p.ids.0, p.out.0);
        let (ni, rl, tr) = (p.n_ids as u64, p.row_len as u64, p.table_rows as u64);
        let basic = self.module.basic()?;
        // Rows of whole 16-byte chunks (f16 rows of a multiple of 8, f32 of 4) take the
        // chunked kernel.
        let row_bytes = p.row_len * p.dtype.size();
        if row_bytes.is_multiple_of(16) && aligned16(&[pt, po]) {
            let chunks = (row_bytes / 16) as u64;
            return self.go(
                &basic.index_select16,
                grid(p.n_ids * chunks as usize),
                THREADS,
                &mut args![pt, pi, po, ni, chunks, tr],
            );
        }
        self.go(
            basic.index_select.get(p.dtype)?,
            grid(n),
            THREADS,
            &mut args![pt, pi, po, ni, rl, tr],
        )
    }

    pub(super) unsafe fn reduce(&self, p: Reduce) -> Result<()> {
        let code = p.op.code() as i32;
        let (px, po) = (p.x.0, p.out.0);
        let basic = self.module.basic()?;
        if p.inner == 1 && p.axis >= 64 {
            // Reducing the last axis: a block per row keeps the reads coalesced.
            let (r, a) = (p.outer as u64, p.axis as u64);
            self.go_rows(
                basic.reduce_rows.get(p.dtype)?,
                p.outer,
                p.axis,
                &mut args![code, px, po, r, a],
            )
        } else {
            let (o, a, i) = (p.outer as u64, p.axis as u64, p.inner as u64);
            self.go(
                basic.reduce.get(p.dtype)?,
                grid(p.outputs()),
                THREADS,
                &mut args![code, px, po, o, a, i],
            )
        }
    }
}
