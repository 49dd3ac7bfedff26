//! Launches of the wgpu backend: the one `match` from [`Kernel`] to pipelines, bound
//! resources and workgroup counts ([`prepare`]), and the prepared [`Launch`] a stream
//! records as one compute pass. The kernels themselves, their WGSL and their pipelines are
//! `kernels.rs`'s; which matmul kernel a shape takes is `choice.rs`'s.

use wgpu::util::DeviceExt;

use super::choice::{gemv_lanes, matmul_kernel, MatmulPath};
use super::kernels::{Pipeline, Pipelines, Which, MAX_PARAMS, PARAM_WORDS};
use super::{blocked, coop, Shared};
use crate::backend::DevicePtr;
use crate::kernel::{
    Activation, Attention, BiasAct, Binary, BinaryOp, Cast, Fill, GatedAct, IndexSelect, Kernel,
    LayerNorm, Matmul, MeanPoolNorm, MeanPoolNormPacked, Reduce, ReduceOp, RmsNorm, Rope, Softmax,
    StridedCopy, Unary, UnaryOp,
};
use crate::sync::Arc;
use crate::{DType, Error, Result};

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

/// Resolves pointers and builds bind groups for one launch.
struct Binder<'a> {
    shared: &'a Shared,
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
    fn new(shared: &'a Shared) -> Self {
        Self {
            shared,
            dispatches: Vec::new(),
            matmul: None,
        }
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

fn unary_code(op: UnaryOp) -> (u32, f32, f32) {
    match op {
        UnaryOp::Relu => (0, 0.0, 0.0),
        UnaryOp::Gelu => (1, 0.0, 0.0),
        UnaryOp::Tanh => (2, 0.0, 0.0),
        UnaryOp::Exp => (3, 0.0, 0.0),
        UnaryOp::Sqrt => (4, 0.0, 0.0),
        UnaryOp::Sqr => (5, 0.0, 0.0),
        UnaryOp::Neg => (6, 0.0, 0.0),
        UnaryOp::Recip => (7, 0.0, 0.0),
        UnaryOp::Affine { mul, add } => (8, mul, add),
    }
}

/// The activation's code in `bias_act.wgsl` and `epilogue.wgsl`.
fn act_code(act: Activation) -> u32 {
    match act {
        Activation::Identity => 0,
        Activation::Relu => 1,
        Activation::Gelu => 2,
        Activation::GeluTanh => 3,
    }
}

fn binary_code(op: BinaryOp) -> u32 {
    match op {
        BinaryOp::Add => 0,
        BinaryOp::Sub => 1,
        BinaryOp::Mul => 2,
        BinaryOp::Div => 3,
        BinaryOp::Max => 4,
    }
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
        Kernel::Fill(Fill { .. }) => "fill",
        Kernel::Copy(StridedCopy { .. }) => "copy",
        Kernel::Cast(Cast { .. }) => "cast",
        Kernel::Matmul(Matmul { .. }) => "matmul",
        Kernel::Unary(Unary { .. }) => "unary",
        Kernel::Binary(Binary { .. }) => "binary",
        Kernel::Softmax(Softmax { .. }) => "softmax",
        Kernel::LayerNorm(LayerNorm { .. }) => "layer_norm",
        Kernel::BiasAct(BiasAct { .. }) => "bias_act",
        Kernel::IndexSelect(IndexSelect { .. }) => "index_select",
        Kernel::Sleep { .. } => "sleep",
        Kernel::Reduce(Reduce { .. }) => "reduce",
        Kernel::Attention(Attention { .. }) => "attention",
        Kernel::MeanPoolNorm(MeanPoolNorm { .. }) => "mean_pool_normalize",
        Kernel::RmsNorm(RmsNorm { .. }) => "rms_norm",
        Kernel::Rope(Rope { .. }) => "rope",
        Kernel::GatedAct(GatedAct { .. }) => "gated_act",
        Kernel::MeanPoolNormPacked(MeanPoolNormPacked { .. }) => "mean_pool_normalize (packed)",
    }
}

/// Resolves `kernel`'s buffers and parameters into a [`Launch`]; `None` when there is
/// nothing to compute. `Kernel::Sleep` is the stream's business and never comes here.
pub(crate) fn prepare(k: &Pipelines, shared: &Shared, kernel: &Kernel) -> Result<Option<Launch>> {
    /// Bytes of the f32 buffers every dtype shares (masks, pooled output) and of the u32
    /// words `ids` and `copy` are addressed in.
    const WORD: u64 = 4;
    let half = match kernel.float_dtype() {
        Some(dt) => storage_half(shared, kernel, dt)?,
        None => false,
    };
    // Element size of the kernel's own dtype.
    let t: u64 = if half { 2 } else { 4 };
    let mut b = Binder::new(shared);
    match kernel {
        Kernel::Fill(Fill {
            out, len, value, ..
        }) => {
            if *len == 0 {
                return Ok(None);
            }
            let (ob, oo) = b.at(*out, t)?;
            let params = [oo, word(*len, "length")?, value.to_bits()];
            b.dispatch(
                &k.get(shared, Which::Fill, half)?,
                &params,
                &[&ob],
                grid_for(*len)?,
            )?;
        }
        Kernel::Cast(Cast {
            x,
            out,
            len,
            from,
            to,
        }) => {
            if *len == 0 {
                return Ok(None);
            }
            let which = match (from, to) {
                (DType::F32, DType::F16) => Which::CastToHalf,
                (DType::F16, DType::F32) => Which::CastToSingle,
                _ => {
                    // Names the dtype WGSL lacks (or the missing SHADER_F16).
                    let odd = if *from == DType::F32 { *to } else { *from };
                    storage_half(shared, kernel, odd)?;
                    return Err(Error::Unavailable(format!(
                        "wgpu backend: cast from {from:?} to {to:?}"
                    )));
                }
            };
            storage_half(shared, kernel, DType::F16)?;
            let (xb, xo) = b.at(*x, from.size() as u64)?;
            let (ob, oo) = b.at(*out, to.size() as u64)?;
            let params = [xo, oo, word(*len, "length")?];
            b.dispatch(
                &k.get(shared, which, true)?,
                &params,
                &[&xb, &ob],
                grid_for(*len)?,
            )?;
        }
        Kernel::Copy(StridedCopy {
            src,
            shape,
            out,
            elem_size,
        }) => {
            let n: usize = shape.iter().product();
            if n == 0 {
                return Ok(None);
            }
            if ![2, 4, 8].contains(elem_size) {
                return Err(Error::InvalidArgument(format!(
                    "wgpu copy: unsupported element size {elem_size}"
                )));
            }
            let (sb, so) = b.at(src.ptr, 1)?;
            let (ob, oo) = b.at(*out, WORD)?;
            let mut params = vec![
                *elem_size as u32,
                word(n, "length")?,
                shape.len() as u32,
                so,
                oo * 4,
            ];
            for d in shape.iter().chain(&src.strides) {
                params.push(word(*d, "dimension")?);
            }
            let threads = if *elem_size == 2 { n.div_ceil(2) } else { n };
            b.dispatch(
                &k.get(shared, Which::Copy, false)?,
                &params,
                &[&sb, &ob],
                grid_for(threads)?,
            )?;
        }
        Kernel::Unary(Unary {
            op, x, out, len, ..
        }) => {
            if *len == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let (code, mul, add) = unary_code(*op);
            let params = [
                code,
                xo,
                oo,
                word(*len, "length")?,
                mul.to_bits(),
                add.to_bits(),
            ];
            b.dispatch(
                &k.get(shared, Which::Unary, half)?,
                &params,
                &[&xb, &ob],
                grid_for(*len)?,
            )?;
        }
        Kernel::Binary(Binary {
            op,
            a,
            b: rhs,
            shape,
            out,
            ..
        }) => {
            let n: usize = shape.iter().product();
            if n == 0 {
                return Ok(None);
            }
            let (ab, ao) = b.at(a.ptr, t)?;
            let (bb, bo) = b.at(rhs.ptr, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let mut params = vec![
                binary_code(*op),
                word(n, "length")?,
                shape.len() as u32,
                ao,
                bo,
                oo,
            ];
            for d in shape.iter().chain(&a.strides).chain(&rhs.strides) {
                params.push(word(*d, "dimension")?);
            }
            b.dispatch(
                &k.get(shared, Which::Binary, half)?,
                &params,
                &[&ab, &bb, &ob],
                grid_for(n)?,
            )?;
        }
        Kernel::Matmul(Matmul {
            a,
            b: rhs,
            out,
            batch,
            m,
            n,
            k: kk,
            bias,
            act,
            ..
        }) => {
            if batch * m * n == 0 {
                return Ok(None);
            }
            let (ab, ao) = b.at(a.ptr, t)?;
            let (bb, bo) = b.at(rhs.ptr, t)?;
            let (ob, oo) = b.at(*out, t)?;
            // The epilogue's bias (without one, `a` is bound in its place and not read).
            let (biasb, biaso) = match bias {
                Some(p) => b.at(*p, t)?,
                None => (ab.clone(), 0),
            };
            let path = matmul_kernel(&shared.matmul, half, *batch, *m, *kk, *n);
            b.matmul = Some(Taken::Other(path));
            let gemv_lanes = gemv_lanes(*batch, *n, *kk);
            // The layout of the blocked and cooperative kernels, chosen here: the vec4
            // variants need every offset, stride and extent they step by four to be a
            // multiple of four (in elements).
            let layout = || {
                let four = |v: &[usize]| v.iter().all(|x| x.is_multiple_of(4));
                let common = a.cs == 1
                    && four(&[ao as usize, a.rs, a.batch_stride, *kk, *n, oo as usize])
                    && four(&[bo as usize, rhs.batch_stride]);
                if common && rhs.rs == 1 && rhs.cs != 1 && rhs.cs.is_multiple_of(4) {
                    blocked::Layout::AlongK
                } else if common && rhs.cs == 1 && rhs.rs.is_multiple_of(4) {
                    blocked::Layout::BAlongN
                } else {
                    blocked::Layout::Generic
                }
            };
            let (pipeline, [bm, bn]) = match path {
                MatmulPath::Simple => (k.get(shared, Which::Matmul, half)?, [16, 16]),
                // One row; 256 / lanes columns per workgroup.
                MatmulPath::Gemv => (k.get(shared, Which::Gemv, half)?, [1, 256 / gemv_lanes]),
                MatmulPath::Coop { bm, bn, bk } => {
                    let spec = coop::Spec {
                        bm,
                        bn,
                        bk,
                        layout: layout(),
                        emulate: shared.matmul.coop.is_some_and(|c| c.emulate),
                    };
                    b.matmul = Some(Taken::Coop(spec));
                    (k.coop(shared, spec)?, [bm as usize, bn as usize])
                }
                MatmulPath::Blocked { bm, bn, bk } => {
                    let spec = blocked::Spec {
                        bm,
                        bn,
                        bk,
                        layout: layout(),
                    };
                    b.matmul = Some(Taken::Blocked(spec));
                    (k.blocked(shared, spec, half)?, [bm as usize, bn as usize])
                }
            };
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
            for first in (0..*batch).step_by(MAX_GROUPS as usize) {
                let count = (*batch - first).min(MAX_GROUPS as usize) as u32;
                let params = [
                    word(*m, "m")?,
                    word(*n, "n")?,
                    word(*kk, "k")?,
                    word(first, "batch")?,
                    ao,
                    word(a.batch_stride, "stride")?,
                    word(a.rs, "stride")?,
                    word(a.cs, "stride")?,
                    bo,
                    word(rhs.batch_stride, "stride")?,
                    word(rhs.rs, "stride")?,
                    word(rhs.cs, "stride")?,
                    oo,
                    biaso,
                    act_code(*act),
                    bias.is_some() as u32,
                    gemv_lanes as u32,
                ];
                b.dispatch(
                    &pipeline,
                    &params,
                    &[&ab, &bb, &ob, &biasb],
                    [tiles[0], tiles[1], count],
                )?;
            }
        }
        Kernel::Softmax(Softmax {
            x, out, rows, cols, ..
        }) => {
            if rows * cols == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let params = [xo, oo, word(*rows, "rows")?, word(*cols, "cols")?];
            b.dispatch(
                &k.get(shared, Which::Softmax, half)?,
                &params,
                &[&xb, &ob],
                grid(*rows)?,
            )?;
        }
        Kernel::LayerNorm(LayerNorm {
            x,
            residual,
            gamma,
            beta,
            out,
            rows,
            cols,
            eps,
            ..
        }) => {
            if rows * cols == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (rb, ro) = match residual {
                Some(r) => b.at(*r, t)?,
                None => (xb.clone(), 0),
            };
            let (gb, go) = b.at(*gamma, t)?;
            let (bb, bo) = b.at(*beta, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let params = [
                xo,
                ro,
                residual.is_some() as u32,
                go,
                bo,
                oo,
                word(*rows, "rows")?,
                word(*cols, "cols")?,
                eps.to_bits(),
            ];
            b.dispatch(
                &k.get(shared, Which::LayerNorm, half)?,
                &params,
                &[&xb, &rb, &gb, &bb, &ob],
                grid(*rows)?,
            )?;
        }
        Kernel::BiasAct(BiasAct {
            x,
            bias,
            out,
            rows,
            cols,
            act,
            ..
        }) => {
            let n = rows * cols;
            if n == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (bb, bo) = b.at(*bias, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let params = [
                xo,
                bo,
                oo,
                word(n, "length")?,
                word(*cols, "cols")?,
                act_code(*act),
            ];
            b.dispatch(
                &k.get(shared, Which::BiasAct, half)?,
                &params,
                &[&xb, &bb, &ob],
                grid_for(n)?,
            )?;
        }
        Kernel::IndexSelect(IndexSelect {
            table,
            ids,
            out,
            n_ids,
            row_len,
            table_rows,
            ..
        }) => {
            let n = n_ids * row_len;
            if n == 0 {
                return Ok(None);
            }
            let (tb, to) = b.at(*table, t)?;
            let (ib, io) = b.at(*ids, WORD)?;
            let (ob, oo) = b.at(*out, t)?;
            let params = [
                to,
                io,
                oo,
                word(n, "length")?,
                word(*row_len, "row length")?,
                // Ids at or past 2^32 are out of range for any table a kernel can bind.
                u32::try_from(*table_rows).unwrap_or(u32::MAX),
            ];
            b.dispatch(
                &k.get(shared, Which::IndexSelect, half)?,
                &params,
                &[&tb, &ib, &ob],
                grid_for(n)?,
            )?;
        }
        Kernel::Reduce(Reduce {
            op,
            x,
            out,
            outer,
            axis,
            inner,
            ..
        }) => {
            let outputs = outer * inner;
            if outputs == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (ob, oo) = b.at(*out, t)?;
            let code = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Mean => 1,
                ReduceOp::Max => 2,
            };
            let params = [
                code,
                xo,
                oo,
                word(*outer, "outer")?,
                word(*axis, "axis")?,
                word(*inner, "inner")?,
            ];
            b.dispatch(
                &k.get(shared, Which::Reduce, half)?,
                &params,
                &[&xb, &ob],
                grid(outputs)?,
            )?;
        }
        Kernel::Attention(Attention {
            packed: Some(_), ..
        })
        | Kernel::MeanPoolNormPacked(MeanPoolNormPacked { .. }) => {
            return Err(Error::Unavailable(
                "wgpu: packed (varlen) batches are not implemented; run them padded".into(),
            ))
        }
        Kernel::Attention(Attention {
            qkv,
            mask,
            out,
            batch,
            seq,
            heads,
            head_dim,
            ..
        }) => {
            let rows = batch * seq * heads;
            if rows * head_dim == 0 {
                return Ok(None);
            }
            if *head_dim > 256 {
                return Err(Error::Unavailable(format!(
                    "wgpu attention: head width {head_dim} over the kernel's 256"
                )));
            }
            let (qb, qo) = b.at(*qkv, t)?;
            // Without a mask, the kernel reads none: bind any buffer in its place.
            let (mb, mo) = match mask {
                Some(m) => b.at(*m, WORD)?,
                None => (qb.clone(), 0),
            };
            let (ob, oo) = b.at(*out, t)?;
            let params = [
                qo,
                mo,
                mask.is_some() as u32,
                oo,
                word(*batch, "batch")?,
                word(*seq, "seq")?,
                word(*heads, "heads")?,
                word(*head_dim, "head width")?,
            ];
            word(rows, "attention rows")?;
            let (which, groups) =
                if shared.attention_tiled && head_dim.is_multiple_of(4) && *head_dim <= 64 {
                    (Which::AttentionTiled, batch * heads * seq.div_ceil(32))
                } else {
                    (Which::Attention, rows)
                };
            b.dispatch(
                &k.get(shared, which, half)?,
                &params,
                &[&qb, &mb, &ob],
                grid(groups)?,
            )?;
        }
        Kernel::MeanPoolNorm(MeanPoolNorm {
            x,
            mask,
            out,
            batch,
            seq,
            dim,
            ..
        }) => {
            if batch * dim == 0 {
                return Ok(None);
            }
            let (xb, xo) = b.at(*x, t)?;
            let (mb, mo) = b.at(*mask, WORD)?;
            let (ob, oo) = b.at(*out, WORD)?;
            let params = [
                xo,
                mo,
                oo,
                word(*batch, "batch")?,
                word(*seq, "seq")?,
                word(*dim, "dim")?,
            ];
            b.dispatch(
                &k.get(shared, Which::MeanPoolNorm, half)?,
                &params,
                &[&xb, &mb, &ob],
                grid(*batch)?,
            )?;
        }
        Kernel::Sleep { .. } => {
            return Err(Error::InvalidArgument(
                "wgpu: Sleep is handled by the stream, not launched".into(),
            ))
        }
        // The newer model families' ops have CPU kernels only so far.
        Kernel::RmsNorm(RmsNorm { .. })
        | Kernel::Rope(Rope { .. })
        | Kernel::GatedAct(GatedAct { .. }) => {
            return Err(Error::Unavailable(format!(
                "wgpu: no {} kernel (the CPU backend runs it)",
                kernel_name(kernel)
            )))
        }
    }
    Ok(b.finish())
}
