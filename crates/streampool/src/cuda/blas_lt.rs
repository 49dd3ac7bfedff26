//! cuBLASLt for matmuls with a bias: `out = act(a @ b + bias)` in one GEMM, the bias and the
//! activation applied in the GEMM's epilogue (`CUBLASLT_EPILOGUE_BIAS`, `RELU_BIAS`,
//! `GELU_BIAS`) instead of a second pass over the output.
//!
//! `GELU_BIAS` computes GELU's tanh approximation ([`Activation::GeluTanh`]); on the H100 at
//! MiniLM's intermediate layer (65,536 x 384 @ 384 x 1536, f16) it took 196 us against 149
//! for the GEMM with the bias epilogue plus 155 for a separate GELU pass
//! (`bench/results/h100-2026-11-23-s4/gelu-epilogue.md`).
//!
//! On the H100 the bias passes of a MiniLM forward (the query/key/value, output and FFN
//! projections) were a read and a write of every activation: a quarter of the f16 forward's
//! kernel time at 512 x 128 tokens. PyTorch's `nn.Linear` gets the same fusion from cuBLASLt.
//!
//! One [`BlasLt`] per stream, beside that stream's cuBLAS handle and behind the same lock. A
//! plan (matmul descriptor, layouts and the heuristic's algorithm) is built once per shape and
//! kept, so a repeated call costs one `cublasLtMatmul`.

use std::collections::HashMap;
use std::ffi::c_void;

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t, cublasLtMatmulDesc_t, cublasLtMatmulPreferenceAttributes_t,
    cublasLtMatrixLayout_t, cudaDataType, cudaStream_t,
};
use cudarc::driver::sys;

use crate::kernel::Activation;
use crate::{DType, Error, Result};

/// A plan's shape: cuBLAS's column-major view of the row-major product (see `Blas::matmul`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct Key {
    dtype: DType,
    act: Activation,
    trans_a: bool,
    trans_b: bool,
    m: u64,
    n: u64,
    k: u64,
    lda: i64,
    ldb: i64,
}

/// Descriptors and the chosen algorithm for one [`Key`]. Owns its descriptors: dropping a
/// plan, complete or half-built, destroys what it holds.
struct Plan {
    desc: cublasLtMatmulDesc_t,
    /// a, b and d, in that order once complete.
    layouts: Vec<cublasLtMatrixLayout_t>,
    algo: Option<cublasLtMatmulAlgo_t>,
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: created by `BlasLt::plan` and owned by this plan alone; a plan is dropped
        // only when its stream's work has finished (see `BlasLt`'s drop) or before it ran.
        unsafe {
            let _ = lt::destroy_matmul_desc(self.desc);
            for &l in &self.layouts {
                let _ = lt::destroy_matrix_layout(l);
            }
        }
    }
}

/// A stream's cuBLASLt handle and its plans.
pub(crate) struct BlasLt {
    handle: cublasLtHandle_t,
    /// `None`: cuBLASLt cannot run this shape (no algorithm, or its matmul failed), so the
    /// caller runs a GEMM and a bias kernel instead.
    plans: HashMap<Key, Option<Plan>>,
    device: String,
}

// SAFETY: the handle and descriptors are plain pointers owned by this value; the owning
// stream's lock serializes every use (cuBLASLt handles may move between threads).
unsafe impl Send for BlasLt {}

fn lt_err(device: &str, what: &str, e: impl std::fmt::Debug) -> Error {
    Error::Backend {
        device: device.to_string(),
        msg: format!("cuBLASLt {what}: {e:?}"),
    }
}

/// One operand of [`BlasLt::matmul_bias`] in cuBLAS's column-major terms.
pub(crate) struct LtOperand {
    pub(crate) ptr: u64,
    pub(crate) transposed: bool,
    pub(crate) ld: usize,
}

impl BlasLt {
    pub(crate) fn new(device: &str) -> Result<Self> {
        let handle = lt::create_handle().map_err(|e| lt_err(device, "create", e))?;
        Ok(Self {
            handle,
            plans: HashMap::new(),
            device: device.to_string(),
        })
    }

    /// Column-major `d[m, n] = act(op(a)[m, k] @ op(b)[k, n] + bias[m])` (bias per row of
    /// `d`, i.e. per column of the row-major output), queued on `stream`. `Ok(false)` when
    /// cuBLASLt cannot run this shape or activation: nothing was queued, and the shape is
    /// remembered as such.
    ///
    /// # Safety
    /// Every pointer is a live device allocation of the described extent; `workspace` holds
    /// `workspace_bytes` and is not used by other work on other streams meanwhile.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn matmul_bias(
        &mut self,
        a: &LtOperand,
        b: &LtOperand,
        bias: u64,
        act: Activation,
        d: u64,
        (m, n, k): (usize, usize, usize),
        dtype: DType,
        stream: sys::CUstream,
        (workspace, workspace_bytes): (u64, usize),
    ) -> Result<bool> {
        let data = match dtype {
            DType::F16 => cudaDataType::CUDA_R_16F,
            DType::BF16 => cudaDataType::CUDA_R_16BF,
            DType::F32 => cudaDataType::CUDA_R_32F,
            DType::I64 => return Err(Error::InvalidArgument("matmul of I64 tensors".into())),
        };
        let epilogue = match act {
            Activation::Identity => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_BIAS,
            Activation::Relu => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_RELU_BIAS,
            Activation::GeluTanh => cublasLtEpilogue_t::CUBLASLT_EPILOGUE_GELU_BIAS,
            Activation::Gelu => return Ok(false), // no erf epilogue
        };
        let key = Key {
            dtype,
            act,
            trans_a: a.transposed,
            trans_b: b.transposed,
            m: m as u64,
            n: n as u64,
            k: k as u64,
            lda: a.ld as i64,
            ldb: b.ld as i64,
        };
        if !self.plans.contains_key(&key) {
            let plan = self.plan(key, data, epilogue, workspace_bytes);
            if let Err(e) = &plan {
                tracing::debug!(
                    "cuBLASLt {act:?} epilogue unavailable for {m}x{n}x{k} {dtype:?}: {e}"
                );
            }
            self.plans.insert(key, plan.ok());
        }
        let Some(Some(plan)) = self.plans.get(&key) else {
            return Ok(false);
        };
        let dev = &self.device;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptor belongs to this plan and is only used under the stream's
        // lock; the bias pointer is read when the matmul is queued (and captured by value
        // into a CUDA graph), so setting it per call is safe. A complete plan has its
        // algorithm and three layouts.
        let queued = unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&bias as *const u64).cast::<c_void>(),
                std::mem::size_of::<u64>(),
            )
            .map_err(|e| lt_err(dev, "set bias", e))
            .and_then(|()| {
                lt::matmul(
                    self.handle,
                    plan.desc,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    a.ptr as *const c_void,
                    plan.layouts[0],
                    b.ptr as *const c_void,
                    plan.layouts[1],
                    d as *const c_void,
                    plan.layouts[2],
                    d as *mut c_void,
                    plan.layouts[2],
                    plan.algo
                        .as_ref()
                        .map_or(std::ptr::null(), |a| a as *const _),
                    workspace as *mut c_void,
                    workspace_bytes,
                    stream as cudaStream_t,
                )
                .map_err(|e| lt_err(dev, "matmul", e))
            })
        };
        match queued {
            Ok(()) => Ok(true),
            Err(e) => {
                tracing::debug!("cuBLASLt {act:?} epilogue failed for {m}x{n}x{k} {dtype:?}: {e}");
                self.plans.insert(key, None);
                Ok(false)
            }
        }
    }

    fn plan(
        &self,
        key: Key,
        data: cudaDataType,
        epilogue: cublasLtEpilogue_t,
        workspace_bytes: usize,
    ) -> Result<Plan> {
        let dev = &self.device;
        let e = |what: &'static str| move |err| lt_err(dev, what, err);
        // f32 accumulation in every dtype (no TF32: f32 plans serve exact-math matmuls only).
        let desc = lt::create_matmul_desc(
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cudaDataType::CUDA_R_32F,
        )
        .map_err(e("create matmul desc"))?;
        // From here on, an early return drops `plan`, which destroys what it holds so far.
        let mut plan = Plan {
            desc,
            layouts: Vec::with_capacity(3),
            algo: None,
        };
        // cublasOperation_t values (the attribute is an int32): CUBLAS_OP_N 0, CUBLAS_OP_T 1.
        let (op_a, op_b) = (i32::from(key.trans_a), i32::from(key.trans_b));
        {
            use cublasLtMatmulDescAttributes_t as A;
            let set = |attr, p: *const c_void, what| {
                // SAFETY: `desc` is live and `p` points at a 4-byte attribute value.
                unsafe { lt::set_matmul_desc_attribute(desc, attr, p, 4) }.map_err(e(what))
            };
            set(
                A::CUBLASLT_MATMUL_DESC_TRANSA,
                (&op_a as *const i32).cast(),
                "set transa",
            )?;
            set(
                A::CUBLASLT_MATMUL_DESC_TRANSB,
                (&op_b as *const i32).cast(),
                "set transb",
            )?;
            set(
                A::CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&epilogue as *const cublasLtEpilogue_t).cast(),
                "set epilogue",
            )?;
        }
        // Stored shapes: a is m x k (k x m if transposed), b is k x n (n x k), d is m x n.
        let (ar, ac) = if key.trans_a {
            (key.k, key.m)
        } else {
            (key.m, key.k)
        };
        let (br, bc) = if key.trans_b {
            (key.n, key.k)
        } else {
            (key.k, key.n)
        };
        for (rows, cols, ld, what) in [
            (ar, ac, key.lda, "layout a"),
            (br, bc, key.ldb, "layout b"),
            (key.m, key.n, key.m as i64, "layout d"),
        ] {
            plan.layouts
                .push(lt::create_matrix_layout(data, rows, cols, ld).map_err(e(what))?);
        }
        let [la, lb, ld] = [plan.layouts[0], plan.layouts[1], plan.layouts[2]];
        let pref = lt::create_matmul_pref().map_err(e("create preference"))?;
        let ws = workspace_bytes as u64;
        // SAFETY: `pref` and the descriptors are live; the attribute is a u64.
        let heuristic = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
            .map_err(e("set workspace preference"))
            .and_then(|()| {
                lt::get_matmul_algo_heuristic(self.handle, desc, la, lb, ld, ld, pref)
                    .map_err(e("no algorithm for this shape"))
            })
        };
        // SAFETY: created above, used by nothing else.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        plan.algo = Some(heuristic?.algo);
        Ok(plan)
    }
}

impl Drop for BlasLt {
    fn drop(&mut self) {
        // The plans first (their own drops), then the handle. SAFETY: the owning stream is
        // being torn down after its work finished (as for the cuBLAS handle).
        self.plans.clear();
        unsafe {
            let _ = lt::destroy_handle(self.handle);
        }
    }
}
