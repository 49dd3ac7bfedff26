//! cuBLASLt for matmuls with a bias: `out = act(a @ b + bias)` in one GEMM, the bias and the
//! activation applied in the GEMM's epilogue (`CUBLASLT_EPILOGUE_BIAS`, `RELU_BIAS`,
//! `GELU_BIAS`) instead of a second pass over the output.
//!
//! `GELU_BIAS` computes GELU's tanh approximation ([`Activation::GeluTanh`]); on the H100 at
//! MiniLM's intermediate layer (65,536 x 384 @ 384 x 1536, f16) it took 196 us against 149
//! for the GEMM with the bias epilogue plus 155 for a separate GELU pass (PyTorch on the same
//! GPU, the same shapes).
//!
//! On the H100 the bias passes of a MiniLM forward (the query/key/value, output and FFN
//! projections) were a read and a write of every activation: a quarter of the f16 forward's
//! kernel time at 512 x 128 tokens. PyTorch's `nn.Linear` gets the same fusion from cuBLASLt.
//!
//! One [`BlasLt`] per stream, beside that stream's cuBLAS handle and behind the same lock. A
//! plan (matmul descriptor, layouts and the heuristic's algorithm) is built once per shape and
//! kept, so a repeated call costs one `cublasLtMatmul`.
//!
//! Algorithm selection: the heuristic's first choice is not always the fastest (on the H100
//! it was 3-14% slower than its 8th for MiniLM's GELU_BIAS GEMM). For a large shape, the
//! first eager call on a pool stream asks the heuristic for up to [`tune_candidates`]
//! algorithms, times each on the call's own operands (CUDA events, a warm-up run then
//! [`TUNE_RUNS`]), and keeps the fastest in a process-wide table keyed by device and shape
//! ([`TuneKey`]: the token dimension is bucketed to a power of two, so packed batches of
//! varying lengths tune once per bucket and reuse the choice after `cublasLtMatmulAlgoCheck`
//! accepts it for their exact shape). Other streams and the graph-capture streams take the
//! choice from the table; a stream that finds the shape being tuned elsewhere, or that is
//! capturing (no waits allowed), runs the heuristic's choice meanwhile and looks again on its
//! next call. `STREAMPOOL_CUBLASLT_TUNE=off` (or `0`; the tunables' `cuda.cublaslt_tune`)
//! keeps the heuristic's choice, `N` times N candidates (16 by default). Each shape's
//! timings are logged at `info` under the target
//! [`CUBLASLT_TUNE_LOG_TARGET`](crate::config::CUBLASLT_TUNE_LOG_TARGET).
//!
//! Choices outlive the process: each one timed is also stored in the device's
//! [`TuningCache`] (the kernel cache's `tuning` folder, keyed by GPU, compute capability,
//! cuBLASLt version and the bucketed shape), and a shape missing from the process table is
//! looked up there before it is timed, so a restarted or autoscaled replica on the same
//! machine times nothing. A stored algorithm goes through the same
//! `cublasLtMatmulAlgoCheck` as any reused choice.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublaslt::result as lt;
use cudarc::cublaslt::sys::{
    cublasComputeType_t, cublasLtEpilogue_t, cublasLtHandle_t, cublasLtMatmulAlgo_t,
    cublasLtMatmulDescAttributes_t, cublasLtMatmulDesc_t, cublasLtMatmulHeuristicResult_t,
    cublasLtMatmulPreferenceAttributes_t, cublasLtMatmulPreference_t, cublasLtMatrixLayout_t,
    cudaDataType, cudaStream_t,
};
use cudarc::driver::sys;

use crate::kernel::Activation;
use crate::{DType, Error, Result, TunedChoice, TuningCache};

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
    /// A residual is added through `C` (beta 1): timed and chosen apart from the same
    /// product without one, whose algorithms need not read `C`.
    residual: bool,
}

/// Descriptors and the chosen algorithm for one [`Key`]. Owns its descriptors: dropping a
/// plan, complete or half-built, destroys what it holds.
struct Plan {
    desc: cublasLtMatmulDesc_t,
    /// a, b and d, in that order once complete.
    layouts: Vec<cublasLtMatrixLayout_t>,
    algo: Option<cublasLtMatmulAlgo_t>,
    /// The algorithm is final: tuned, taken from [`TUNED`], or tuning does not apply.
    settled: bool,
}

/// Timed runs per candidate algorithm, after one warm-up run.
const TUNE_RUNS: u32 = 5;

/// Shapes under this many multiply-adds keep the heuristic's choice: timing them costs more
/// than any choice could save (MiniLM's smallest tuned GEMM, 64 sentences x 32 tokens x 384 x
/// 384, has 0.3 G).
const TUNE_MIN_MACS: u64 = 1 << 28;

/// How many of the heuristic's algorithms to time (the tunables' `cuda.cublaslt_tune`,
/// `STREAMPOOL_CUBLASLT_TUNE`: `off`/`0` none, else a count up to 32; 16 by default). On the
/// H100 the fastest of MiniLM's GELU_BIAS GEMMs was the heuristic's last (8th) at most token
/// counts; asked for 16 or 32, cuBLASLt 13.0 still offered 8 for every MiniLM shape.
pub(crate) fn tune_candidates() -> usize {
    crate::config::tuning().cuda.cublaslt_tune.min(32)
}

/// Whether a product with `k` inputs and `n` outputs per row takes its residual through `C`
/// (the tunables' `cuda.cublaslt_residual`, `STREAMPOOL_CUBLASLT_RESIDUAL`: `off`/`0` never,
/// `all` always; by default when `k >= 2n`).
/// Reading the residual in the epilogue moves a read of the output's size from the LayerNorm
/// after it into the GEMM: that pays where the GEMM is bound by its arithmetic (MiniLM's
/// second FFN product, 1536 -> 384: the extra read hides under the math) and not where it is
/// bound by memory (the attention output's 384 -> 384, which would read as much more as the
/// LayerNorm saves).
pub(crate) fn fuse_residual(k: usize, n: usize) -> bool {
    use crate::config::ResidualFusion;
    match crate::config::tuning().cuda.cublaslt_residual {
        ResidualFusion::Off => false,
        ResidualFusion::All => true,
        ResidualFusion::Auto => k >= 2 * n,
    }
}

/// A tuned shape: the plan key with the column count (the token dimension: `Blas::matmul_bias`
/// passes the row-major output's rows as cuBLAS's `n`) rounded up to a power of two, and the
/// device it was timed on.
#[derive(Clone, PartialEq, Eq, Hash)]
struct TuneKey {
    device: String,
    key: Key,
}

impl TuneKey {
    fn new(device: &str, mut key: Key) -> Self {
        key.n = key.n.next_power_of_two();
        Self {
            device: device.to_string(),
            key,
        }
    }
}

#[derive(Clone, Copy)]
enum Tuned {
    /// A stream is timing this shape now.
    InProgress,
    /// The fastest algorithm measured (`None`: keep each plan's heuristic choice).
    Done(Option<cublasLtMatmulAlgo_t>),
}

/// The process-wide choices, shared by every stream's [`BlasLt`]. The lock is held for a
/// lookup or an insert only, never while timing.
static TUNED: OnceLock<Mutex<HashMap<TuneKey, Tuned>>> = OnceLock::new();

fn tuned_table() -> std::sync::MutexGuard<'static, HashMap<TuneKey, Tuned>> {
    // A panic while the lock is held leaves the map consistent (single inserts): recover.
    TUNED
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Each device's tuning cache (by device name, as [`TuneKey`]), set when the device opens.
static TUNING_DISK: OnceLock<Mutex<HashMap<String, Arc<TuningCache>>>> = OnceLock::new();

fn tuning_disks() -> std::sync::MutexGuard<'static, HashMap<String, Arc<TuningCache>>> {
    // A panic while the lock is held leaves the map consistent (single inserts): recover.
    TUNING_DISK
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

/// Makes `cache` the tuning cache of device `device` (`None`: none). A device opened again
/// under the same name replaces the earlier one's.
pub(crate) fn set_tuning_cache(device: &str, cache: Option<TuningCache>) {
    let mut disks = tuning_disks();
    match cache {
        Some(c) => disks.insert(device.to_string(), Arc::new(c)),
        None => disks.remove(device),
    };
}

fn tuning_cache(device: &str) -> Option<Arc<TuningCache>> {
    tuning_disks().get(device).cloned()
}

/// `cuBLASLt <version>`, part of every tuning cache key (another version may rank the
/// algorithms differently, or number them differently).
pub(crate) fn library_version() -> String {
    // SAFETY: a plain query with no arguments; the library was found at device open.
    format!("cuBLASLt {}", unsafe {
        cudarc::cublaslt::sys::cublasLtGetVersion()
    })
}

impl TuneKey {
    /// The tuning cache's text of this shape (the device is the cache's scope).
    fn shape_text(&self) -> String {
        let k = &self.key;
        format!(
            "{:?} {:?} ta={} tb={} m={} n={} k={} lda={} ldb={} residual={} candidates={}",
            k.dtype,
            k.act,
            k.trans_a,
            k.trans_b,
            k.m,
            k.n,
            k.k,
            k.lda,
            k.ldb,
            k.residual,
            tune_candidates()
        )
    }
}

/// An algorithm as the tuning cache stores it, and back.
fn algo_choice(algo: Option<cublasLtMatmulAlgo_t>) -> TunedChoice {
    match algo {
        Some(a) => TunedChoice::Algorithm(a.data),
        None => TunedChoice::Heuristic,
    }
}

fn choice_algo(choice: TunedChoice) -> Option<cublasLtMatmulAlgo_t> {
    match choice {
        TunedChoice::Heuristic => None,
        TunedChoice::Algorithm(data) => Some(cublasLtMatmulAlgo_t { data }),
    }
}

/// What [`BlasLt::settle`] should do for a plan that is not settled yet.
enum Step {
    Tune,
    Use(Option<cublasLtMatmulAlgo_t>),
    Wait,
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

    /// Column-major `d[m, n] = act(op(a)[m, k] @ op(b)[k, n] + bias[m] (+ c[m, n]))` (bias per
    /// row of `d`, i.e. per column of the row-major output; `c`, a residual laid out as `d`,
    /// through cuBLASLt's `C` with beta 1), queued on `stream`. `Ok(false)` when
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
        c: Option<u64>,
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
            residual: c.is_some(),
        };
        if !self.plans.contains_key(&key) {
            // Timed (`crate::phases`): part of what a new shape costs on its first call.
            let plan = crate::phases::timed("cuBLASLt plan", || {
                self.plan(key, data, epilogue, workspace_bytes)
            });
            if let Err(e) = &plan {
                tracing::debug!(
                    "cuBLASLt {act:?} epilogue unavailable for {m}x{n}x{k} {dtype:?}: {e}"
                );
            }
            self.plans.insert(key, plan.ok());
        }
        match self.plans.get(&key) {
            Some(Some(plan)) if !plan.settled => {
                // SAFETY: forwarded from the caller (live operands, this stream's workspace).
                unsafe {
                    self.settle(
                        key,
                        a,
                        b,
                        (bias, c),
                        d,
                        stream,
                        (workspace, workspace_bytes),
                    );
                }
            }
            Some(Some(_)) => {}
            _ => return Ok(false),
        }
        let Some(Some(plan)) = self.plans.get(&key) else {
            return Ok(false);
        };
        // SAFETY: forwarded from the caller; a complete plan has its algorithm.
        let queued = unsafe {
            self.launch(
                plan,
                plan.algo.as_ref(),
                (a, b),
                (bias, c),
                d,
                stream,
                (workspace, workspace_bytes),
            )
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

    /// Queues `plan`'s product with `algo` (`None`: cuBLASLt's own choice): sets the bias
    /// pointer and calls `cublasLtMatmul`, with `c` as the `C` operand and beta 1 where given
    /// (else `d` and beta 0, which cuBLASLt does not read). The one sequence of the run path
    /// and the timing loop.
    ///
    /// # Safety
    /// As [`BlasLt::matmul_bias`]: live operands of the plan's shape, this stream's workspace,
    /// the descriptor used under the stream's lock. The bias pointer is read when the matmul
    /// is queued (and captured by value into a CUDA graph), so setting it per call is safe.
    #[allow(clippy::too_many_arguments)]
    unsafe fn launch(
        &self,
        plan: &Plan,
        algo: Option<&cublasLtMatmulAlgo_t>,
        (a, b): (&LtOperand, &LtOperand),
        (bias, c): (u64, Option<u64>),
        d: u64,
        stream: sys::CUstream,
        (workspace, workspace_bytes): (u64, usize),
    ) -> Result<()> {
        let dev = &self.device;
        let alpha = 1.0f32;
        let beta = if c.is_some() { 1.0f32 } else { 0.0 };
        // SAFETY: per this function's contract; a complete plan has three layouts (c shares
        // d's).
        unsafe {
            lt::set_matmul_desc_attribute(
                plan.desc,
                cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                (&bias as *const u64).cast::<c_void>(),
                std::mem::size_of::<u64>(),
            )
            .map_err(|e| lt_err(dev, "set bias", e))?;
            lt::matmul(
                self.handle,
                plan.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                a.ptr as *const c_void,
                plan.layouts[0],
                b.ptr as *const c_void,
                plan.layouts[1],
                c.unwrap_or(d) as *const c_void,
                plan.layouts[2],
                d as *mut c_void,
                plan.layouts[2],
                algo.map_or(std::ptr::null(), |a| a as *const _),
                workspace as *mut c_void,
                workspace_bytes,
                stream as cudaStream_t,
            )
            .map_err(|e| lt_err(dev, "matmul", e))
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
            settled: false,
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
        plan.settled = tune_candidates() == 0 || key.m * key.n * key.k < TUNE_MIN_MACS;
        Ok(plan)
    }

    /// Up to `count` algorithms the heuristic offers for `plan` within the workspace.
    fn candidates(
        &self,
        plan: &Plan,
        count: usize,
        workspace_bytes: usize,
    ) -> Vec<cublasLtMatmulAlgo_t> {
        let Ok(pref) = lt::create_matmul_pref() else {
            return Vec::new();
        };
        let ws = workspace_bytes as u64;
        let [la, lb, ld] = [plan.layouts[0], plan.layouts[1], plan.layouts[2]];
        // SAFETY: all-zero bytes are a valid value of this plain C struct (integers, floats
        // and an integer-valued enum whose 0 is CUBLAS_STATUS_SUCCESS).
        let mut results: Vec<cublasLtMatmulHeuristicResult_t> =
            vec![unsafe { std::mem::zeroed() }; count];
        let mut found = 0i32;
        // SAFETY: `pref` and the plan's descriptors are live; `results` holds `count` entries
        // for cuBLASLt to fill and `found` receives how many it filled.
        let ok = unsafe {
            lt::set_matmul_pref_attribute(
                pref,
                cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws as *const u64).cast(),
                8,
            )
            .is_ok()
                && cudarc::cublaslt::sys::cublasLtMatmulAlgoGetHeuristic(
                    self.handle,
                    plan.desc,
                    la,
                    lb,
                    ld,
                    ld,
                    pref as cublasLtMatmulPreference_t,
                    count as i32,
                    results.as_mut_ptr(),
                    &mut found,
                )
                .result()
                .is_ok()
        };
        // SAFETY: created above, used by nothing else.
        unsafe {
            let _ = lt::destroy_matmul_pref(pref);
        }
        if !ok {
            return Vec::new();
        }
        results.truncate(found.max(0) as usize);
        results
            .into_iter()
            .filter(|r| {
                r.state == cudarc::cublaslt::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS
                    && r.workspaceSize <= workspace_bytes
            })
            .map(|r| r.algo)
            .collect()
    }

    /// Whether `algo` runs `plan`'s exact shape within the workspace.
    fn accepts(&self, plan: &Plan, algo: &cublasLtMatmulAlgo_t, workspace_bytes: usize) -> bool {
        let [la, lb, ld] = [plan.layouts[0], plan.layouts[1], plan.layouts[2]];
        // SAFETY: as in `candidates`, a zeroed result is valid and cuBLASLt fills it.
        let mut r: cublasLtMatmulHeuristicResult_t = unsafe { std::mem::zeroed() };
        // SAFETY: the handle and the plan's descriptors are live; `algo` and `r` are valid for
        // the call.
        let ok = unsafe {
            cudarc::cublaslt::sys::cublasLtMatmulAlgoCheck(
                self.handle,
                plan.desc,
                la,
                lb,
                ld,
                ld,
                algo,
                &mut r,
            )
        }
        .result()
        .is_ok();
        ok && r.workspaceSize <= workspace_bytes
    }

    /// Brings the plan of `key` to its final algorithm where possible: from [`TUNED`], or by
    /// timing the heuristic's candidates now (first eager call of the shape in the process).
    /// Leaves the plan unsettled (heuristic choice) while another stream tunes it or this
    /// stream is capturing a graph. Errors only ever cost the tuning, never the call.
    ///
    /// # Safety
    /// As [`BlasLt::matmul_bias`]; in addition `d` does not overlap `a`, `b`, `bias` or `c`
    /// (cuBLASLt requires it anyway), so the timed runs leave the inputs intact.
    #[allow(clippy::too_many_arguments)]
    unsafe fn settle(
        &mut self,
        key: Key,
        a: &LtOperand,
        b: &LtOperand,
        (bias, c): (u64, Option<u64>),
        d: u64,
        stream: sys::CUstream,
        (workspace, workspace_bytes): (u64, usize),
    ) {
        let tkey = TuneKey::new(&self.device, key);
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is live (caller); `status` is written by the call.
        let capturing = unsafe { sys::cuStreamIsCapturing(stream, &mut status) }
            .result()
            .is_err()
            || status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let disk = tuning_cache(&self.device);
        let known = tuned_table().get(&tkey).copied();
        let step = match known {
            Some(Tuned::Done(algo)) => Step::Use(algo),
            Some(Tuned::InProgress) => Step::Wait,
            None => {
                // Timed by an earlier process on this machine? Read with no lock held (a
                // file read, no GPU work: fine while capturing too).
                let stored = disk.as_ref().and_then(|d| d.get(&tkey.shape_text()));
                let mut table = tuned_table();
                match (table.get(&tkey).copied(), stored) {
                    (Some(Tuned::Done(algo)), _) => Step::Use(algo),
                    (Some(Tuned::InProgress), _) => Step::Wait,
                    (None, Some(choice)) => {
                        let algo = choice_algo(choice);
                        table.insert(tkey.clone(), Tuned::Done(algo));
                        Step::Use(algo)
                    }
                    (None, None) if capturing => Step::Wait,
                    (None, None) => {
                        table.insert(tkey.clone(), Tuned::InProgress);
                        Step::Tune
                    }
                }
            }
        };
        let Some(Some(plan)) = self.plans.get(&key) else {
            return;
        };
        let chosen = match step {
            Step::Wait => return,
            Step::Use(algo) => algo,
            Step::Tune => {
                // SAFETY: forwarded from the caller.
                let best = crate::phases::timed("cuBLASLt tuning", || unsafe {
                    self.time_candidates(
                        key,
                        plan,
                        a,
                        b,
                        (bias, c),
                        d,
                        stream,
                        (workspace, workspace_bytes),
                    )
                });
                if let Some(d) = &disk {
                    if let Err(e) = d.put(&tkey.shape_text(), algo_choice(best)) {
                        tracing::warn!(dir = %d.dir().display(), error = %e,
                            "tuning cache not writable: the next process times this shape again");
                    }
                }
                tuned_table().insert(tkey, Tuned::Done(best));
                best
            }
        };
        let accepted = chosen.filter(|algo| self.accepts(plan, algo, workspace_bytes));
        if let Some(Some(plan)) = self.plans.get_mut(&key) {
            if let Some(algo) = accepted {
                plan.algo = Some(algo);
            }
            plan.settled = true;
        }
    }

    /// Times the heuristic's candidates for `plan` on the given operands and returns the
    /// fastest (`None` if fewer than two ran). Synchronizes `stream`.
    ///
    /// # Safety
    /// As [`BlasLt::settle`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn time_candidates(
        &self,
        key: Key,
        plan: &Plan,
        a: &LtOperand,
        b: &LtOperand,
        (bias, c): (u64, Option<u64>),
        d: u64,
        stream: sys::CUstream,
        (workspace, workspace_bytes): (u64, usize),
    ) -> Option<cublasLtMatmulAlgo_t> {
        let algos = self.candidates(plan, tune_candidates(), workspace_bytes);
        if algos.len() < 2 {
            return None;
        }
        let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
        let (Ok(start), Ok(end)) = (
            cudarc::driver::result::event::create(flags),
            cudarc::driver::result::event::create(flags),
        ) else {
            return None;
        };
        let run = |algo: &cublasLtMatmulAlgo_t| {
            // SAFETY: forwarded from the caller (as `matmul_bias`'s call).
            unsafe {
                self.launch(
                    plan,
                    Some(algo),
                    (a, b),
                    (bias, c),
                    d,
                    stream,
                    (workspace, workspace_bytes),
                )
            }
            .is_ok()
        };
        let mut times = Vec::with_capacity(algos.len());
        for algo in &algos {
            // SAFETY: the events are live and belong to this context; `stream` is live.
            let ms = unsafe {
                if !run(algo) {
                    continue;
                }
                let timed = cudarc::driver::result::event::record(start, stream).is_ok()
                    && (0..TUNE_RUNS).all(|_| run(algo))
                    && cudarc::driver::result::event::record(end, stream).is_ok()
                    && cudarc::driver::result::event::synchronize(end).is_ok();
                if !timed {
                    continue;
                }
                cudarc::driver::result::event::elapsed(start, end)
            };
            if let Ok(ms) = ms {
                times.push((ms, *algo));
            }
        }
        // SAFETY: the events were synchronized (or never recorded) and are not used again.
        unsafe {
            let _ = cudarc::driver::result::event::destroy(start);
            let _ = cudarc::driver::result::event::destroy(end);
        }
        // Under a target of its own, so that a subscriber can show these (one line per tuned
        // shape) without the rest of the runtime's info logs.
        tracing::info!(
            target: crate::config::CUBLASLT_TUNE_LOG_TARGET,
            "cuBLASLt tuning {}x{}x{} {:?} {:?}{}: ms per {} runs, heuristic's order: {:?}",
            key.m,
            key.n,
            key.k,
            key.dtype,
            key.act,
            if key.residual { " + residual" } else { "" },
            TUNE_RUNS,
            times.iter().map(|t| t.0).collect::<Vec<_>>()
        );
        if times.len() < 2 {
            return None;
        }
        times.iter().min_by(|x, y| x.0.total_cmp(&y.0)).map(|t| t.1)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u64) -> Key {
        Key {
            dtype: DType::F16,
            act: Activation::GeluTanh,
            trans_a: false,
            trans_b: true,
            m: 1536,
            n,
            k: 384,
            lda: 1536,
            ldb: 384,
            residual: false,
        }
    }

    #[test]
    fn the_stored_shape_names_every_field_of_the_bucketed_key() {
        let t = |k: Key| TuneKey::new("cuda:0", k).shape_text();
        // Same bucket, same entry; another bucket or field, another entry.
        assert_eq!(t(key(1000)), t(key(1024)));
        assert_ne!(t(key(1024)), t(key(1025)));
        let base = t(key(1024));
        let variants = [
            Key {
                dtype: DType::BF16,
                ..key(1024)
            },
            Key {
                act: Activation::Identity,
                ..key(1024)
            },
            Key {
                trans_a: true,
                ..key(1024)
            },
            Key {
                trans_b: false,
                ..key(1024)
            },
            Key {
                m: 384,
                ..key(1024)
            },
            Key {
                k: 1536,
                ..key(1024)
            },
            Key {
                lda: 4096,
                ..key(1024)
            },
            Key {
                ldb: 4096,
                ..key(1024)
            },
            Key {
                residual: true,
                ..key(1024)
            },
        ];
        for v in variants {
            assert_ne!(t(v), base);
        }
        // The algorithm's words survive the round trip through the cache's choice.
        let algo = cublasLtMatmulAlgo_t {
            data: [1, 2, 3, 4, 5, 6, 7, u64::MAX],
        };
        assert_eq!(
            choice_algo(algo_choice(Some(algo))).map(|a| a.data),
            Some(algo.data)
        );
        assert!(choice_algo(algo_choice(None)).is_none());
    }

    #[test]
    fn tuned_shapes_share_a_power_of_two_token_bucket_per_device() {
        let t = |n, dev| TuneKey::new(dev, key(n));
        // Packed batches of 513..1024 tokens share the 1024 bucket's choice.
        assert!(t(1000, "cuda:0") == t(1024, "cuda:0"));
        assert!(t(513, "cuda:0") == t(1024, "cuda:0"));
        assert!(t(1025, "cuda:0") != t(1024, "cuda:0"));
        assert!(t(512, "cuda:0") != t(513, "cuda:0"));
        // The weights' dimensions and the device are kept exactly.
        assert_eq!(t(1000, "cuda:0").key.m, 1536);
        assert_eq!(t(1000, "cuda:0").key.k, 384);
        assert_eq!(t(1000, "cuda:0").key.n, 1024);
        assert!(t(1024, "cuda:0") != t(1024, "cuda:1"));
    }
}
