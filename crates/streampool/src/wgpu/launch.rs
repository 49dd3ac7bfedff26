//! Launches of the wgpu backend: [`prepare`], the `match` from [`Kernel`] to the function
//! of each operation (in this module's children: `elementwise`, `gather`, `reduce`,
//! `matmul`, `attention`), which picks pipelines, binds resources and sizes the workgroup
//! grid; and the prepared [`Launch`] a stream records as one compute pass. The kernels
//! themselves, their WGSL and their pipelines are `kernels.rs`'s; which matmul kernel a
//! shape takes is `choice.rs`'s.

use wgpu::util::DeviceExt;

use super::choice::MatmulPath;
use super::kernels::{Pipeline, Pipelines, Which, MAX_PARAMS, PARAM_WORDS};
use super::{blocked, coop, Shared};
use crate::backend::DevicePtr;
use crate::kernel::{Attention, Kernel};
use crate::sync::Arc;
use crate::{DType, Error, Result};

mod attention;
mod elementwise;
mod gather;
mod matmul;
mod reduce;

/// Workgroups along one dispatch dimension (WebGPU's default limit).
const MAX_GROUPS: u32 = 65_535;

/// The matmul kernel a launch took.
#[derive(Debug, Clone, Copy)]
enum Taken {
    Blocked(blocked::Spec),
    Coop(coop::Spec),
    Other(MatmulPath),
}

/// A prepared launch: pipelines, bound resources and workgroup counts, ready to record.
pub(crate) struct Launch {
    dispatches: Vec<(wgpu::ComputePipeline, wgpu::BindGroup, [u32; 3])>,
    /// The matmul kernel taken, for the profile's label.
    matmul: Option<Taken>,
}

impl Launch {
    /// The matmul kernel this launch takes, in words (`None` for other kernels).
    pub(crate) fn note(&self) -> Option<String> {
        self.matmul.map(|taken| match taken {
            Taken::Blocked(s) => s.label(),
            Taken::Coop(s) => s.label(),
            Taken::Other(MatmulPath::Gemv) => "gemv".into(),
            Taken::Other(_) => "matmul 16x16".into(),
        })
    }

    /// Records the launch as one compute pass; `timestamps`: the query set and first of the
    /// two indices its start and end timestamps go to (the profile).
    pub(crate) fn record(
        &self,
        enc: &mut wgpu::CommandEncoder,
        timestamps: Option<(wgpu::QuerySet, u32)>,
    ) {
        let writes = timestamps
            .as_ref()
            .map(|(set, i)| wgpu::ComputePassTimestampWrites {
                query_set: set,
                beginning_of_pass_write_index: Some(*i),
                end_of_pass_write_index: Some(*i + 1),
            });
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: writes,
        });
        for (pipeline, group, [x, y, z]) in &self.dispatches {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, group, &[]);
            pass.dispatch_workgroups(*x, *y, *z);
        }
    }
}

/// Bytes of the f32 buffers every dtype shares (masks, pooled output) and of the u32 words
/// `ids` and `copy` are addressed in.
const WORD: u64 = 4;

/// Resolves pointers and builds bind groups for one launch.
struct Binder<'a> {
    pipelines: &'a Pipelines,
    shared: &'a Shared,
    /// Whether the kernel runs on `f16` storage ([`storage_half`]).
    half: bool,
    /// Bytes of an element of the kernel's own dtype.
    t: u64,
    dispatches: Vec<(wgpu::ComputePipeline, wgpu::BindGroup, [u32; 3])>,
    matmul: Option<Taken>,
}

/// A count or index as a kernel word, or an error when it does not fit.
fn word(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v)
        .map_err(|_| Error::InvalidArgument(format!("wgpu kernel: {what} {v} exceeds 2^32")))
}

/// Workgroups for `groups` workgroups on a 2-D grid (one dimension holds at most 65,535).
fn grid(groups: usize) -> Result<[u32; 3]> {
    let groups = word(groups, "workgroup count")?;
    let x = groups.clamp(1, MAX_GROUPS);
    Ok([x, groups.div_ceil(x), 1])
}

/// Workgroups for `n` invocations in 256-wide workgroups.
fn grid_for(n: usize) -> Result<[u32; 3]> {
    grid(n.div_ceil(256))
}

impl<'a> Binder<'a> {
    fn new(pipelines: &'a Pipelines, shared: &'a Shared, half: bool) -> Self {
        Self {
            pipelines,
            shared,
            half,
            t: if half { 2 } else { 4 },
            dispatches: Vec::new(),
            matmul: None,
        }
    }

    /// The pipeline of `which` in the kernel's storage type.
    fn pipeline(&self, which: Which) -> Result<Arc<Pipeline>> {
        self.pipelines.get(self.shared, which, self.half)
    }

    /// The buffer of `ptr`, a tensor of the kernel's dtype, and the offset into it in
    /// elements.
    fn elem(&self, ptr: DevicePtr) -> Result<(wgpu::Buffer, u32)> {
        self.at(ptr, self.t)
    }

    /// The buffer of `ptr` and the offset into it in units of `unit` bytes.
    fn at(&self, ptr: DevicePtr, unit: u64) -> Result<(wgpu::Buffer, u32)> {
        let (buffer, offset) = self.shared.memory.resolve(ptr)?;
        if offset % unit != 0 {
            return Err(Error::InvalidArgument(format!(
                "wgpu kernel: byte offset {offset} is not a multiple of {unit}"
            )));
        }
        Ok((buffer, word((offset / unit) as usize, "offset")?))
    }

    fn dispatch(
        &mut self,
        k: &Arc<Pipeline>,
        params: &[u32],
        buffers: &[&wgpu::Buffer],
        groups: [u32; 3],
    ) -> Result<()> {
        if params.len() > MAX_PARAMS {
            return Err(Error::InvalidArgument(format!(
                "wgpu kernel: {} parameter words (rank too high); at most {MAX_PARAMS}",
                params.len()
            )));
        }
        let mut words = [0u32; PARAM_WORDS];
        words[..params.len()].copy_from_slice(params);
        let device = &self.shared.device;
        let uniform = if self.shared.mapped_params {
            // Written through its own mapping: no staging buffer and no copy on the queue
            // (what `create_buffer_init` does for a buffer the host cannot map).
            let b = device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("streampool params"),
                size: (PARAM_WORDS * 4) as u64,
                usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::MAP_WRITE,
                mapped_at_creation: true,
            });
            b.get_mapped_range_mut(..)
                .map_err(|e| {
                    self.shared
                        .backend_err(format!("mapping a params buffer: {e}"))
                })?
                .copy_from_slice(bytes_of(&words));
            b.unmap();
            b
        } else {
            device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("streampool params"),
                contents: bytes_of(&words),
                usage: wgpu::BufferUsages::UNIFORM,
            })
        };
        let mut entries = vec![wgpu::BindGroupEntry {
            binding: 0,
            resource: uniform.as_entire_binding(),
        }];
        for (i, b) in buffers.iter().enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: i as u32 + 1,
                resource: b.as_entire_binding(),
            });
        }
        let group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &k.layout,
            entries: &entries,
        });
        self.dispatches.push((k.pipeline.clone(), group, groups));
        Ok(())
    }

    fn finish(self) -> Option<Launch> {
        Some(Launch {
            dispatches: self.dispatches,
            matmul: self.matmul,
        })
    }
}

fn bytes_of(words: &[u32]) -> &[u8] {
    // SAFETY: `u32` has no padding and any byte pattern of it is valid; the slice covers
    // exactly the words' memory, borrowed for the same lifetime.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), std::mem::size_of_val(words)) }
}

/// Whether `kernel` runs on `f16` storage (`true`) or `f32` (`false`): `F16` needs the
/// adapter's `SHADER_F16` (WGSL's `enable f16`), and `BF16` has no WGSL type at all; both
/// refusals are clear errors rather than wrong answers. A TF32 matmul request runs in full
/// f32, which is at least as accurate.
fn storage_half(shared: &Shared, kernel: &Kernel, dtype: DType) -> Result<bool> {
    match dtype {
        DType::F32 => Ok(false),
        DType::F16 if shared.shader_f16 => Ok(true),
        DType::F16 => Err(Error::Unavailable(format!(
            "wgpu backend: {} in F16 needs the adapter's SHADER_F16 feature, which {} lacks \
             (convert with to_dtype(F32))",
            kernel_name(kernel),
            shared.name
        ))),
        other => Err(Error::Unavailable(format!(
            "wgpu backend: {} in {other:?}: WGSL has no such type (F32 everywhere, F16 where \
             the adapter has SHADER_F16; convert with to_dtype)",
            kernel_name(kernel)
        ))),
    }
}

/// The variant's name, for error messages.
fn kernel_name(kernel: &Kernel) -> &'static str {
    match kernel {
        Kernel::Fill(_) => "fill",
        Kernel::Copy(_) => "copy",
        Kernel::Cast(_) => "cast",
        Kernel::Matmul(_) => "matmul",
        Kernel::Unary(_) => "unary",
        Kernel::Binary(_) => "binary",
        Kernel::Softmax(_) => "softmax",
        Kernel::LayerNorm(_) => "layer_norm",
        Kernel::BiasAct(_) => "bias_act",
        Kernel::IndexSelect(_) => "index_select",
        Kernel::Sleep { .. } => "sleep",
        Kernel::Reduce(_) => "reduce",
        Kernel::Attention(_) => "attention",
        Kernel::MeanPoolNorm(_) => "mean_pool_normalize",
        Kernel::RmsNorm(_) => "rms_norm",
        Kernel::Rope(_) => "rope",
        Kernel::GatedAct(_) => "gated_act",
        Kernel::MeanPoolNormPacked(_) => "mean_pool_normalize (packed)",
    }
}

/// Resolves `kernel`'s buffers and parameters into a [`Launch`]; `None` when there is
/// nothing to compute. `Kernel::Sleep` is the stream's business and never comes here.
pub(crate) fn prepare(k: &Pipelines, shared: &Shared, kernel: &Kernel) -> Result<Option<Launch>> {
    let half = match kernel.float_dtype() {
        Some(dt) => storage_half(shared, kernel, dt)?,
        None => false,
    };
    let mut b = Binder::new(k, shared, half);
    match kernel {
        Kernel::Attention(Attention {
            packed: Some(_), ..
        })
        | Kernel::MeanPoolNormPacked(_) => {
            return Err(Error::Unavailable(
                "wgpu: packed (varlen) batches are not implemented; run them padded".into(),
            ))
        }
        Kernel::Sleep { .. } => {
            return Err(Error::InvalidArgument(
                "wgpu: Sleep is handled by the stream, not launched".into(),
            ))
        }
        // The newer model families' ops have CPU kernels only so far.
        Kernel::RmsNorm(_) | Kernel::Rope(_) | Kernel::GatedAct(_) => {
            return Err(Error::Unavailable(format!(
                "wgpu: no {} kernel (the CPU backend runs it)",
                kernel_name(kernel)
            )))
        }
        _ if kernel.is_empty() => return Ok(None),
        Kernel::Fill(p) => b.fill(p)?,
        Kernel::Cast(p) => b.cast(kernel, p)?,
        Kernel::Copy(p) => b.copy(p)?,
        Kernel::Unary(p) => b.unary(p)?,
        Kernel::Binary(p) => b.binary(p)?,
        Kernel::Matmul(p) => b.matmul(p)?,
        Kernel::Softmax(p) => b.softmax(p)?,
        Kernel::LayerNorm(p) => b.layer_norm(p)?,
        Kernel::BiasAct(p) => b.bias_act(p)?,
        Kernel::IndexSelect(p) => b.index_select(p)?,
        Kernel::Reduce(p) => b.reduce(p)?,
        Kernel::Attention(p) => b.attention(p)?,
        Kernel::MeanPoolNorm(p) => b.mean_pool_norm(p)?,
    }
    Ok(b.finish())
}
