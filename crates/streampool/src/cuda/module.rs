//! `kernels.cu` loaded into a device's context: the CUDA module and the functions the
//! launcher ([`super::kernels`]) calls, built once per device through its
//! [`KernelCache`](crate::KernelCache). How the module's image is made (an NVRTC compile or
//! the on-disk cache) is [`super::nvrtc`]'s business.

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::driver_err;
use super::nvrtc;
use crate::disk_cache::DiskCache;
use crate::phases::timed;
use crate::sync::Arc;
use crate::{DType, Error, Result};

/// The CUDA C source of every kernel.
pub(crate) const SOURCE: &str = include_str!("kernels.cu");

/// One kernel in each floating-point storage type: `NAME_f32`, `NAME_f16`, `NAME_bf16`.
pub(crate) struct PerDType([CudaFunction; 3]);

impl PerDType {
    pub(super) fn get(&self, dtype: DType) -> Result<&CudaFunction> {
        match dtype {
            DType::F32 => Ok(&self.0[0]),
            DType::F16 => Ok(&self.0[1]),
            DType::BF16 => Ok(&self.0[2]),
            DType::I64 => Err(Error::InvalidArgument(
                "floating-point kernel launched on I64 data".into(),
            )),
        }
    }
}

/// The loaded module and its functions.
pub(crate) struct Module {
    _module: Arc<CudaModule>,
    pub(super) fill: PerDType,
    pub(super) cast: CudaFunction,
    pub(super) copy: [CudaFunction; 3],
    pub(super) unary: PerDType,
    pub(super) binary: PerDType,
    pub(super) softmax: PerDType,
    pub(super) layer_norm: PerDType,
    pub(super) layer_norm_warp: PerDType,
    /// `sp_layer_norm_vec8_g{4,8}_{f16,bf16}`: `[g4, g8][f16, bf16]`.
    pub(super) layer_norm_vec8: [[CudaFunction; 2]; 2],
    pub(super) bias_act: PerDType,
    pub(super) bias_act4: PerDType,
    pub(super) bias_act_rows8: PerDType,
    pub(super) index_select: PerDType,
    /// `sp_index_select16`: rows in 16-byte chunks, any dtype.
    pub(super) index_select16: CudaFunction,
    pub(super) reduce: PerDType,
    pub(super) reduce_rows: PerDType,
    pub(super) attention: [PerDType; 4],
    /// Tensor-core attention per head width of `ATTENTION_HEAD_DIMS` (16, 32, 64, 128),
    /// `[f16, bf16]`; only when `tensor_cores` (the kernels are empty below sm_80).
    pub(super) attention_mma: [[CudaFunction; 2]; 4],
    pub(super) tensor_cores: bool,
    pub(super) mean_pool_norm: PerDType,
    pub(super) rms_norm: PerDType,
    pub(super) rope: PerDType,
    pub(super) gated_act: PerDType,
    pub(super) pool_rows: PerDType,
    pub(super) sleep: CudaFunction,
}

impl Module {
    /// Loads `kernels.cu` into `ctx`: from `disk` when an earlier process left this GPU
    /// architecture's build there, else compiled with NVRTC (and stored in `disk`).
    pub(crate) fn build(
        ctx: &Arc<CudaContext>,
        device: &str,
        disk: Option<&DiskCache>,
    ) -> Result<Module> {
        let cc = ctx.compute_capability().ok();
        // mma.sync with f16/bf16 inputs and f32 accumulation needs sm_80.
        let tensor_cores = matches!(cc, Some((major, _)) if major >= 8);
        let module = nvrtc::load(ctx, device, "streampool_kernels.cu", SOURCE, cc, disk)?;
        timed("kernels loaded", || {
            Self::functions(module, tensor_cores, device)
        })
    }

    /// Looks up every function the launcher uses (with lazy module loading, the driver
    /// loads each one's code here).
    fn functions(module: Arc<CudaModule>, tensor_cores: bool, device: &str) -> Result<Module> {
        let f = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_err(device, e))
        };
        let f3 = |name: &str| -> Result<PerDType> {
            Ok(PerDType([
                f(&format!("{name}_f32"))?,
                f(&format!("{name}_f16"))?,
                f(&format!("{name}_bf16"))?,
            ]))
        };
        Ok(Module {
            fill: f3("sp_fill")?,
            cast: f("sp_cast")?,
            copy: [f("sp_copy16")?, f("sp_copy32")?, f("sp_copy64")?],
            unary: f3("sp_unary")?,
            binary: f3("sp_binary")?,
            softmax: f3("sp_softmax")?,
            layer_norm: f3("sp_layer_norm")?,
            layer_norm_warp: f3("sp_layer_norm_warp")?,
            layer_norm_vec8: {
                let f2 = |g: usize| -> Result<[CudaFunction; 2]> {
                    Ok([
                        f(&format!("sp_layer_norm_vec8_g{g}_f16"))?,
                        f(&format!("sp_layer_norm_vec8_g{g}_bf16"))?,
                    ])
                };
                [f2(4)?, f2(8)?]
            },
            bias_act: f3("sp_bias_act")?,
            bias_act4: f3("sp_bias_act4")?,
            bias_act_rows8: f3("sp_bias_act_rows8")?,
            index_select: f3("sp_index_select")?,
            index_select16: f("sp_index_select16")?,
            reduce: f3("sp_reduce")?,
            reduce_rows: f3("sp_reduce_rows")?,
            attention: [
                f3("sp_attention16")?,
                f3("sp_attention32")?,
                f3("sp_attention64")?,
                f3("sp_attention128")?,
            ],
            attention_mma: {
                let f2 = |hd: usize| -> Result<[CudaFunction; 2]> {
                    Ok([
                        f(&format!("sp_attention_mma{hd}_f16"))?,
                        f(&format!("sp_attention_mma{hd}_bf16"))?,
                    ])
                };
                [f2(16)?, f2(32)?, f2(64)?, f2(128)?]
            },
            tensor_cores,
            mean_pool_norm: f3("sp_mean_pool_norm")?,
            rms_norm: f3("sp_rms_norm")?,
            rope: f3("sp_rope")?,
            gated_act: f3("sp_gated_act")?,
            pool_rows: f3("sp_pool_rows")?,
            sleep: f("sp_sleep")?,
            _module: module,
        })
    }
}
