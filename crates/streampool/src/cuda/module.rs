//! `kernels.cu` loaded into a device's context: one CUDA module per kernel group
//! ([`KERNEL_GROUPS`]), each built on its first launch (or by [`Module::load_all`], which
//! builds the groups on several threads at once), and the functions the launcher
//! ([`super::kernels`]) calls. How a group's image is made (embedded at build time, the
//! on-disk cache or an NVRTC compile) is [`super::nvrtc`]'s business.

use std::sync::OnceLock;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};

use super::driver_err;
use super::kernel_groups::KERNEL_GROUPS;
use super::nvrtc;
use crate::disk_cache::DiskCache;
use crate::sync::{Arc, Mutex};
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

/// Group `basic`: fills, casts, copies, element-wise ops, gathers, reductions, softmax.
pub(crate) struct Basic {
    pub(super) fill: PerDType,
    pub(super) cast: CudaFunction,
    pub(super) copy: [CudaFunction; 3],
    pub(super) unary: PerDType,
    pub(super) binary: PerDType,
    pub(super) softmax: PerDType,
    pub(super) index_select: PerDType,
    /// `sp_index_select16`: rows in 16-byte chunks, any dtype.
    pub(super) index_select16: CudaFunction,
    pub(super) reduce: PerDType,
    pub(super) reduce_rows: PerDType,
    pub(super) sleep: CudaFunction,
}

/// Group `norm`: layer and RMS norms.
pub(crate) struct Norm {
    pub(super) layer_norm: PerDType,
    pub(super) layer_norm_warp: PerDType,
    /// `sp_layer_norm_vec8_g{4,8}_{f16,bf16}`: `[g4, g8][f16, bf16]`.
    pub(super) layer_norm_vec8: [[CudaFunction; 2]; 2],
    pub(super) rms_norm: PerDType,
}

/// Group `act`: bias and activation epilogues, gated activations, rotary positions.
pub(crate) struct Act {
    pub(super) bias_act: PerDType,
    pub(super) bias_act4: PerDType,
    pub(super) bias_act_rows8: PerDType,
    pub(super) rope: PerDType,
    pub(super) gated_act: PerDType,
}

/// Group `pool`: mean pooling (padded and packed).
pub(crate) struct Pool {
    pub(super) mean_pool_norm: PerDType,
    pub(super) pool_rows: PerDType,
}

/// A group's module and functions, built once by the first caller.
struct Lazy<T> {
    /// Set once; read with no lock on every launch.
    value: OnceLock<(Arc<CudaModule>, T)>,
    /// Held across the group's build, so concurrent first callers wait for the one build
    /// instead of compiling it again (callers of other groups are not held up). Never held
    /// across a GPU wait.
    building: Mutex<()>,
}

impl<T> Lazy<T> {
    fn new() -> Self {
        Self {
            value: OnceLock::new(),
            building: Mutex::new(()),
        }
    }

    fn is_loaded(&self) -> bool {
        self.value.get().is_some()
    }
}

/// A group's function lookup: the function of this name in the group's module.
type Lookup<'a> = dyn Fn(&str) -> Result<CudaFunction> + 'a;

/// What a group's build needs.
struct Builder {
    ctx: Arc<CudaContext>,
    device: String,
    cc: Option<(i32, i32)>,
    disk: Option<DiskCache>,
    images: nvrtc::ImageSources,
}

/// The device's kernels, one lazily built module per group.
pub(crate) struct Module {
    builder: Builder,
    basic: Lazy<Basic>,
    norm: Lazy<Norm>,
    act: Lazy<Act>,
    pool: Lazy<Pool>,
    /// The SIMT attention per head width of `ATTENTION_HEAD_DIMS` (16, 32, 64, 128).
    attention: [Lazy<PerDType>; 4],
    /// Tensor-core attention per head width, `[f16, bf16]`; only when `tensor_cores` (the
    /// kernels are empty below sm_80).
    attention_mma: [Lazy<[CudaFunction; 2]>; 4],
    pub(super) tensor_cores: bool,
}

/// `KERNEL_GROUPS`' `SP_GROUP` value of the group named `name`.
fn group_id(device: &str, name: &str) -> Result<u32> {
    KERNEL_GROUPS
        .iter()
        .find(|g| g.0 == name)
        .map(|g| g.1)
        .ok_or_else(|| Error::Backend {
            device: device.to_string(),
            msg: format!("no kernel group {name}"),
        })
}

impl Module {
    /// The device's kernels, none built yet: each group is built by its first launch (or
    /// [`Module::load_all`]), from the kernels embedded at build time, `disk`, or NVRTC.
    pub(crate) fn new(
        ctx: &Arc<CudaContext>,
        device: &str,
        disk: Option<&DiskCache>,
        images: nvrtc::ImageSources,
    ) -> Module {
        let cc = ctx.compute_capability().ok();
        // mma.sync with f16/bf16 inputs and f32 accumulation needs sm_80.
        let tensor_cores = matches!(cc, Some((major, _)) if major >= 8);
        Module {
            builder: Builder {
                ctx: ctx.clone(),
                device: device.to_string(),
                cc,
                disk: disk.cloned(),
                images,
            },
            basic: Lazy::new(),
            norm: Lazy::new(),
            act: Lazy::new(),
            pool: Lazy::new(),
            attention: std::array::from_fn(|_| Lazy::new()),
            attention_mma: std::array::from_fn(|_| Lazy::new()),
            tensor_cores,
        }
    }

    /// The value of `lazy`, building group `group` (its module, then `fns` over its
    /// functions) if no caller has yet.
    fn get<'a, T>(
        &'a self,
        lazy: &'a Lazy<T>,
        group: &str,
        fns: impl FnOnce(&Lookup<'_>) -> Result<T>,
    ) -> Result<&'a T> {
        if let Some((_, v)) = lazy.value.get() {
            return Ok(v);
        }
        let _building = lazy.building.lock();
        if let Some((_, v)) = lazy.value.get() {
            return Ok(v);
        }
        let b = &self.builder;
        let module = nvrtc::load_group(
            &b.ctx,
            &b.device,
            (group, group_id(&b.device, group)?),
            b.cc,
            b.disk.as_ref(),
            b.images,
        )?;
        let lookup = |name: &str| {
            module
                .load_function(name)
                .map_err(|e| driver_err(&b.device, e))
        };
        let value = fns(&lookup)?;
        // We hold `building` and found the cell empty, so this set is the only one.
        let _ = lazy.value.set((module, value));
        match lazy.value.get() {
            Some((_, v)) => Ok(v),
            None => Err(Error::Backend {
                device: b.device.clone(),
                msg: format!("kernel group {group} was built but not kept"),
            }),
        }
    }

    pub(super) fn basic(&self) -> Result<&Basic> {
        self.get(&self.basic, "basic", |f| {
            Ok(Basic {
                fill: per_dtype(f, "sp_fill")?,
                cast: f("sp_cast")?,
                copy: [f("sp_copy16")?, f("sp_copy32")?, f("sp_copy64")?],
                unary: per_dtype(f, "sp_unary")?,
                binary: per_dtype(f, "sp_binary")?,
                softmax: per_dtype(f, "sp_softmax")?,
                index_select: per_dtype(f, "sp_index_select")?,
                index_select16: f("sp_index_select16")?,
                reduce: per_dtype(f, "sp_reduce")?,
                reduce_rows: per_dtype(f, "sp_reduce_rows")?,
                sleep: f("sp_sleep")?,
            })
        })
    }

    pub(super) fn norm(&self) -> Result<&Norm> {
        self.get(&self.norm, "norm", |f| {
            let vec8 = |g: usize| -> Result<[CudaFunction; 2]> {
                Ok([
                    f(&format!("sp_layer_norm_vec8_g{g}_f16"))?,
                    f(&format!("sp_layer_norm_vec8_g{g}_bf16"))?,
                ])
            };
            Ok(Norm {
                layer_norm: per_dtype(f, "sp_layer_norm")?,
                layer_norm_warp: per_dtype(f, "sp_layer_norm_warp")?,
                layer_norm_vec8: [vec8(4)?, vec8(8)?],
                rms_norm: per_dtype(f, "sp_rms_norm")?,
            })
        })
    }

    pub(super) fn act(&self) -> Result<&Act> {
        self.get(&self.act, "act", |f| {
            Ok(Act {
                bias_act: per_dtype(f, "sp_bias_act")?,
                bias_act4: per_dtype(f, "sp_bias_act4")?,
                bias_act_rows8: per_dtype(f, "sp_bias_act_rows8")?,
                rope: per_dtype(f, "sp_rope")?,
                gated_act: per_dtype(f, "sp_gated_act")?,
            })
        })
    }

    pub(super) fn pool(&self) -> Result<&Pool> {
        self.get(&self.pool, "pool", |f| {
            Ok(Pool {
                mean_pool_norm: per_dtype(f, "sp_mean_pool_norm")?,
                pool_rows: per_dtype(f, "sp_pool_rows")?,
            })
        })
    }

    /// The SIMT attention for head width slot `slot` (of `ATTENTION_HEAD_DIMS`).
    pub(super) fn attention(&self, slot: usize) -> Result<&PerDType> {
        let hd = 16usize << slot;
        self.get(&self.attention[slot], &format!("attention{hd}"), |f| {
            per_dtype(f, &format!("sp_attention{hd}"))
        })
    }

    /// The tensor-core attention for head width slot `slot`, `[f16, bf16]`.
    pub(super) fn attention_mma(&self, slot: usize) -> Result<&[CudaFunction; 2]> {
        let hd = 16usize << slot;
        self.get(
            &self.attention_mma[slot],
            &format!("attention_mma{hd}"),
            |f| {
                Ok([
                    f(&format!("sp_attention_mma{hd}_f16"))?,
                    f(&format!("sp_attention_mma{hd}_bf16"))?,
                ])
            },
        )
    }

    /// Builds every group this GPU can run that is not built yet, on up to `threads`
    /// threads at once (NVRTC compiles are single-threaded; the groups are independent).
    /// `basic` is taken first: the weights' conversion launches it. Returns the first error.
    pub(crate) fn load_all(&self, threads: usize) -> Result<()> {
        type Task<'a> = Box<dyn Fn() -> Result<()> + Send + Sync + 'a>;
        let mut tasks: Vec<(bool, Task<'_>)> = vec![
            (self.basic.is_loaded(), Box::new(|| self.basic().map(drop))),
            (self.norm.is_loaded(), Box::new(|| self.norm().map(drop))),
            (self.act.is_loaded(), Box::new(|| self.act().map(drop))),
            (self.pool.is_loaded(), Box::new(|| self.pool().map(drop))),
        ];
        for slot in 0..4 {
            if self.tensor_cores {
                tasks.push((
                    self.attention_mma[slot].is_loaded(),
                    Box::new(move || self.attention_mma(slot).map(drop)),
                ));
            }
            tasks.push((
                self.attention[slot].is_loaded(),
                Box::new(move || self.attention(slot).map(drop)),
            ));
        }
        let tasks: Vec<Task<'_>> = tasks
            .into_iter()
            .filter(|(loaded, _)| !loaded)
            .map(|t| t.1)
            .collect();
        let next = crate::sync::AtomicUsize::new(0);
        let first_error = Mutex::new(None);
        // The caller's start-up phases, so that the builds on the threads below count there.
        let phases = crate::phases::current();
        let work = || loop {
            // Only a counter handing out distinct indices: no ordering with other memory.
            let i = next.fetch_add(1, crate::sync::Ordering::Relaxed);
            let Some(task) = tasks.get(i) else { break };
            if let Err(e) = task() {
                first_error.lock().get_or_insert(e);
            }
        };
        std::thread::scope(|s| {
            for _ in 0..threads.clamp(1, tasks.len().max(1)) {
                // Each module load makes the context current on its thread (cudarc).
                s.spawn(|| match &phases {
                    Some(p) => p.scope(work),
                    None => work(),
                });
            }
        });
        let first_error = first_error.lock().take();
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// The `_f32`, `_f16` and `_bf16` kernels of `name`.
fn per_dtype(f: &Lookup<'_>, name: &str) -> Result<PerDType> {
    Ok(PerDType([
        f(&format!("{name}_f32"))?,
        f(&format!("{name}_f16"))?,
        f(&format!("{name}_bf16"))?,
    ]))
}
