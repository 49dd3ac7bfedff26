//! Products through cuBLAS (cuBLASLt's epilogues where they fit), with the bias, activation
//! and residual launched after the product where no epilogue does them.

use super::Launcher;
use crate::cuda::blas::Blas;
use crate::kernel::{Activation, BiasAct, Binary, BinaryOp, Fill, Kernel, Matmul, Strided};
use crate::phases::timed;
use crate::{Error, Result};

impl Launcher<'_> {
    pub(super) unsafe fn matmul(&self, p: Matmul) -> Result<()> {
        let Matmul {
            a,
            b,
            bias,
            residual,
            act,
            out,
            batch,
            m: rows,
            n,
            k,
            dtype,
            math,
            b_pack: _,
        } = p;
        if k == 0 {
            // An empty sum: zeros (cuBLAS may skip writing `out` when k == 0).
            return self.launch(Kernel::Fill(Fill {
                out,
                len: batch * rows * n,
                value: 0.0,
                dtype,
            }));
        }
        // Held only while the gemm is queued (never across a wait), so two threads
        // sharing this stream never drive its handle at once.
        let mut guard = self.blas.lock();
        if guard.is_none() {
            *guard = Some(timed("cuBLAS handle", || {
                Blas::new(self.stream, self.device)
            })?);
        }
        let blas = guard.as_mut().expect("created above");
        if let (Some(bias), 1) = (bias, batch) {
            let c = residual.map(|r| r.0);
            if blas.matmul_bias(&a, &b, bias.0, c, act, out.0, (rows, n, k), dtype, math)? {
                return Ok(());
            }
        }
        blas.matmul(&a, &b, out.0, (batch, rows, n, k), dtype, math)?;
        drop(guard);
        // No epilogue for this shape: the bias and activation in place (each element
        // is read and then written by the same thread), then the residual if any.
        match bias {
            Some(bias) => self.launch(Kernel::BiasAct(BiasAct {
                x: out,
                bias,
                out,
                rows: batch * rows,
                cols: n,
                act,
                dtype,
            }))?,
            None if act == Activation::Identity => {}
            None => {
                return Err(Error::InvalidArgument(
                    "matmul: an activation epilogue needs a bias".into(),
                ))
            }
        }
        let Some(r) = residual else {
            return Ok(());
        };
        let flat = |ptr| Strided {
            ptr,
            strides: smallvec::smallvec![1],
        };
        self.launch(Kernel::Binary(Binary {
            op: BinaryOp::Add,
            a: flat(out),
            b: flat(r),
            shape: smallvec::smallvec![batch * rows * n],
            out,
            dtype,
        }))
    }
}
