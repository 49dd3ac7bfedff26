//! Backend-neutral descriptions of the operations a backend must run.
//!
//! The tensor layer checks shapes, dtypes and devices, allocates outputs and then describes
//! the work as one of these values. Floating-point kernels carry the [`DType`] of their
//! tensors (`F32`, `F16` or `BF16`; inputs and output share it unless a variant says
//! otherwise) and compute in `f32` whatever the storage type: half values are widened on load
//! and rounded once on store, and sums, softmax and LayerNorm statistics accumulate in `f32`
//! or wider. Indices are `i64`. All sizes and strides are in elements; every output is
//! contiguous and row-major.

use std::any::Any;
use std::sync::{Arc, OnceLock};

use crate::device_ptr::DevicePtr;
use crate::shape::Dims;
use crate::DType;

/// A strided view of an input of the kernel's dtype (for `Copy`, of any width): element `idx` (a multi-index
/// over the kernel's shape) lives at `ptr + sum(idx[d] * strides[d]) * elem_size`. A broadcast
/// dimension has stride 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Strided {
    pub ptr: DevicePtr,
    pub strides: Dims,
}

/// One matmul operand of shape `[batch, rows, cols]`: element `(b, r, c)` is at
/// `ptr + (b * batch_stride + r * rs + c * cs) * dtype.size()`. Either `rs` or `cs` is 1 (backends
/// such as cuBLAS need one unit stride); `batch_stride` may be 0 (broadcast).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatOperand {
    pub ptr: DevicePtr,
    pub batch_stride: usize,
    pub rs: usize,
    pub cs: usize,
}

/// Room for a backend's own copy of a [`Kernel::Matmul`] right operand: a weight packed
/// into the layout the backend's GEMM reads, built by the first product that uses it and
/// reused by every later one, on any stream or thread (the CPU backend's prepacked
/// weights).
///
/// The tensor layer attaches one to products whose right operand is a plain matrix kept in
/// a storage that is written once and never again (every storage but a graph pool's), one
/// slot per storage, living as long as it does. The slot is filled once
/// ([`OnceLock`]): after that, reading it takes no lock. What a backend puts there says
/// which operand it packed (pointer, strides, shape); a product whose operand differs (the
/// same storage under another view) packs per call as without a slot.
#[derive(Clone, Default)]
pub struct PackSlot(Arc<OnceLock<Box<dyn Any + Send + Sync>>>);

impl PackSlot {
    /// The packed operand, built by `pack` on first use (a concurrent first caller waits
    /// for it).
    pub fn get_or_init(
        &self,
        pack: impl FnOnce() -> Box<dyn Any + Send + Sync>,
    ) -> &(dyn Any + Send + Sync) {
        self.0.get_or_init(pack).as_ref()
    }

    /// The packed operand, if some product built it.
    pub fn get(&self) -> Option<&(dyn Any + Send + Sync)> {
        self.0.get().map(|b| b.as_ref())
    }
}

impl std::fmt::Debug for PackSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = if self.0.get().is_some() {
            "packed"
        } else {
            "empty"
        };
        write!(f, "PackSlot({state})")
    }
}

/// Two slots are equal when they are the same slot.
impl PartialEq for PackSlot {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

/// How an `F32` matmul may trade exactness for speed: TF32 tensor cores on CUDA, int8
/// arithmetic on the CPU. Half-precision matmuls always use the tensor cores (with `f32`
/// accumulation); this only matters for `F32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MatmulMath {
    /// Full `f32` products (CUDA cores on CUDA; matches the CPU backend to ~1e-6).
    #[default]
    Exact,
    /// Inputs rounded to TF32 (10-bit mantissa) on the tensor cores, `f32` accumulation:
    /// several times faster on Ampere and later, ~1e-3 relative error. The CPU backend
    /// computes it exactly.
    Tf32,
    /// Both operands quantized to 8-bit integers per group of 32 consecutive inputs (the
    /// right operand, a weight, per output column and group to `[-64, 64]`, once; the left
    /// one per row and group to `[-127, 127]`, on every call), multiplied with exact `i32`
    /// sums per group and scaled back to `f32` before the bias and activation: `out[i, j] =
    /// act(sum_g f32(sum_{p in g} qa[i, p] qb[p, j]) * (sa[i, g] * sb[g, j]) + bias[j])` with
    /// `sa[i, g] = max_{p in g} |a[i, p]| / 127`, `qa[i, p] = round_even(a[i, p] / sa[i, g])`,
    /// `sb[g, j] = max_{p in g} |b[p, j]| / 64` and `qb[p, j] = round_even(b[p, j] / sb[g,
    /// j])`. Every CPU path (AVX-512 VNNI, AVX-VNNI, AVX2, portable) computes the same bits.
    /// The CPU backend only (where the backend reports
    /// [`Device::runs_int8_matmul`](crate::Device::runs_int8_matmul));
    /// elsewhere a product asking for it fails with [`Error::Unavailable`](crate::Error).
    Int8,
}

impl MatmulMath {
    /// What a product in this mode computes, in words that change whenever its arithmetic
    /// does: what a cache of results measured through it (the accuracy gate's verdicts)
    /// keys on.
    ///
    /// ```
    /// use streampool::MatmulMath;
    /// assert_ne!(MatmulMath::Int8.arithmetic(), MatmulMath::Exact.arithmetic());
    /// ```
    pub fn arithmetic(self) -> &'static str {
        match self {
            MatmulMath::Exact => "f32",
            MatmulMath::Tf32 => "tf32 inputs, f32 sums",
            MatmulMath::Int8 => crate::cpu::kernels::INT8_ARITHMETIC,
        }
    }
}

/// The sequences of a packed batch: `tokens` rows holding sequences back to back, sequence
/// `b` in rows `offsets[b]..offsets[b + 1]` (flash-attention's varlen `cu_seqlens`). `ptr`
/// holds the `batch + 1` offsets as `I64`, non-decreasing from 0 to `tokens`. Kernels clamp
/// what they read to `0..tokens`, so offsets that break this rule give unspecified rows, never
/// an access outside the tensors.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SeqOffsets {
    pub ptr: DevicePtr,
    pub tokens: usize,
}

/// Element-wise functions of one argument.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum UnaryOp {
    Relu,
    /// GELU, erf form: `x * 0.5 * (1 + erf(x / sqrt(2)))`.
    Gelu,
    Tanh,
    Exp,
    Sqrt,
    Sqr,
    Neg,
    Recip,
    /// `x * mul + add`.
    Affine {
        mul: f32,
        add: f32,
    },
}

impl UnaryOp {
    /// The function's number in the GPU backends' unary kernels (`sp_unary` in
    /// `kernels.cu`, `unary.wgsl`); only `Affine` reads the kernels' `mul` and `add`.
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    pub(crate) fn code(self) -> u32 {
        match self {
            UnaryOp::Relu => 0,
            UnaryOp::Gelu => 1,
            UnaryOp::Tanh => 2,
            UnaryOp::Exp => 3,
            UnaryOp::Sqrt => 4,
            UnaryOp::Sqr => 5,
            UnaryOp::Neg => 6,
            UnaryOp::Recip => 7,
            UnaryOp::Affine { .. } => 8,
        }
    }
}

/// Element-wise functions of two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
}

impl BinaryOp {
    /// The function's number in the GPU backends' binary kernels (`sp_binary` in
    /// `kernels.cu`, `binary.wgsl`).
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    pub(crate) fn code(self) -> u32 {
        match self {
            BinaryOp::Add => 0,
            BinaryOp::Sub => 1,
            BinaryOp::Mul => 2,
            BinaryOp::Div => 3,
            BinaryOp::Max => 4,
        }
    }
}

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

impl ReduceOp {
    /// The reduction's number in the GPU backends' reduce kernels (`kernels.cu`,
    /// `reduce.wgsl`).
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    pub(crate) fn code(self) -> u32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Mean => 1,
            ReduceOp::Max => 2,
        }
    }
}

/// Activation applied by the fused bias kernel and the matmul epilogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activation {
    Identity,
    Relu,
    /// GELU, erf form: `x * 0.5 * (1 + erf(x / sqrt(2)))` (BERT's `gelu`).
    Gelu,
    /// GELU, tanh approximation: `0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))`
    /// (Hugging Face's `gelu_new` / `gelu_pytorch_tanh`; what cuBLASLt's GELU epilogue
    /// computes).
    GeluTanh,
}

impl Activation {
    /// The activation's number in the GPU backends' bias and epilogue kernels (`kernels.cu`,
    /// `bias_act.wgsl`, `epilogue.wgsl`).
    #[cfg(any(feature = "cuda", feature = "wgpu"))]
    pub(crate) fn code(self) -> u32 {
        match self {
            Activation::Identity => 0,
            Activation::Relu => 1,
            Activation::Gelu => 2,
            Activation::GeluTanh => 3,
        }
    }
}

/// Activation of a gated MLP's gate ([`Kernel::GatedAct`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateActivation {
    /// GELU, erf form (GeGLU: GTE).
    Gelu,
    /// GELU, tanh approximation (`gelu_pytorch_tanh`, `gelu_new`).
    GeluTanh,
    /// SiLU, `x * sigmoid(x)` (SwiGLU: Qwen, Llama, NomicBERT).
    Silu,
}

/// One unit of device work. Each operation's fields are a struct of its own, which a
/// backend's function for that operation takes whole.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// [`Fill`].
    Fill(Fill),
    /// [`Cast`].
    Cast(Cast),
    /// [`StridedCopy`].
    Copy(StridedCopy),
    /// [`Matmul`].
    Matmul(Matmul),
    /// [`Unary`].
    Unary(Unary),
    /// [`Binary`].
    Binary(Binary),
    /// [`Softmax`].
    Softmax(Softmax),
    /// [`LayerNorm`].
    LayerNorm(LayerNorm),
    /// [`BiasAct`].
    BiasAct(BiasAct),
    /// [`IndexSelect`].
    IndexSelect(IndexSelect),
    /// Keeps the stream busy for `nanos` nanoseconds (tests use it to make a stream slow on
    /// purpose, to prove cross-stream ordering).
    Sleep { nanos: u64 },
    /// [`Reduce`].
    Reduce(Reduce),
    /// [`Attention`].
    Attention(Attention),
    /// [`RmsNorm`].
    RmsNorm(RmsNorm),
    /// [`Rope`].
    Rope(Rope),
    /// [`GatedAct`].
    GatedAct(GatedAct),
    /// [`MeanPoolNorm`].
    MeanPoolNorm(MeanPoolNorm),
    /// [`MeanPoolNormPacked`].
    MeanPoolNormPacked(MeanPoolNormPacked),
}

/// `out[i] = value` (rounded to `dtype`) for `len` elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fill {
    pub out: DevicePtr,
    pub len: usize,
    pub value: f32,
    pub dtype: DType,
}

/// `out[i] = x[i]` converted from `from` to `to` (both floating point), `len` elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cast {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub len: usize,
    pub from: DType,
    pub to: DType,
}

/// Gathers a strided view of `shape` into contiguous `out`; `elem_size` bytes per element.
#[derive(Debug, Clone, PartialEq)]
pub struct StridedCopy {
    pub src: Strided,
    pub shape: Dims,
    pub out: DevicePtr,
    pub elem_size: usize,
}

impl StridedCopy {
    /// Elements copied.
    pub(crate) fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// `out[b] = act(a[b] @ b[b] + bias)` with `a: [batch, m, k]`, `b: [batch, k, n]`,
/// `out: [batch, m, n]`; `bias[j]` (`n` contiguous elements, optional) is added to every
/// output column `j`, then `act` applied (`Identity` unless `bias` is set). The CUDA
/// backend does both in the GEMM's epilogue where cuBLASLt has one for `act`.
/// `b_pack` (CPU): where `b`, a weight, may be kept packed between calls ([`PackSlot`]).
/// `residual` (`[batch, m, n]` contiguous, only with a bias and `Identity`) is added too,
/// `out = a @ b + bias + residual`; only a backend whose
/// [`BackendStream::fuses_matmul_residual`](crate::backend::BackendStream::fuses_matmul_residual)
/// says so receives one.
#[derive(Debug, Clone, PartialEq)]
pub struct Matmul {
    pub a: MatOperand,
    pub b: MatOperand,
    pub b_pack: Option<PackSlot>,
    pub bias: Option<DevicePtr>,
    pub residual: Option<DevicePtr>,
    pub act: Activation,
    pub out: DevicePtr,
    pub batch: usize,
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub dtype: DType,
    pub math: MatmulMath,
}

/// `out[i] = op(x[i])` over `len` contiguous elements.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Unary {
    pub op: UnaryOp,
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub len: usize,
    pub dtype: DType,
}

/// `out[idx] = op(a[idx], b[idx])` over `shape`, with broadcasting through zero strides.
#[derive(Debug, Clone, PartialEq)]
pub struct Binary {
    pub op: BinaryOp,
    pub a: Strided,
    pub b: Strided,
    pub shape: Dims,
    pub out: DevicePtr,
    pub dtype: DType,
}

impl Binary {
    /// Elements of the output.
    pub(crate) fn len(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Softmax over the last axis of a contiguous `[rows, cols]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Softmax {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub rows: usize,
    pub cols: usize,
    pub dtype: DType,
}

/// `out = layer_norm(x + residual) * gamma + beta` over the last axis of `[rows, cols]`;
/// `residual` is optional (the fused residual + LayerNorm of post-norm transformers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNorm {
    pub x: DevicePtr,
    pub residual: Option<DevicePtr>,
    pub gamma: DevicePtr,
    pub beta: DevicePtr,
    pub out: DevicePtr,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
    pub dtype: DType,
}

/// `out = act(x + bias)` with `x: [rows, cols]` and `bias: [cols]` (fused bias + activation).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BiasAct {
    pub x: DevicePtr,
    pub bias: DevicePtr,
    pub out: DevicePtr,
    pub rows: usize,
    pub cols: usize,
    pub act: Activation,
    pub dtype: DType,
}

impl BiasAct {
    /// Elements of the output.
    pub(crate) fn len(&self) -> usize {
        self.rows * self.cols
    }
}

/// `out[i, :] = table[ids[i], :]`; `ids` are `i64`; ids outside `0..table_rows` give zero rows.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IndexSelect {
    pub table: DevicePtr,
    pub ids: DevicePtr,
    pub out: DevicePtr,
    pub n_ids: usize,
    pub row_len: usize,
    pub table_rows: usize,
    pub dtype: DType,
}

impl IndexSelect {
    /// Elements of the output.
    pub(crate) fn len(&self) -> usize {
        self.n_ids * self.row_len
    }
}

/// Reduces the middle axis of a contiguous `[outer, axis, inner]` into `[outer, inner]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reduce {
    pub op: ReduceOp,
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub outer: usize,
    pub axis: usize,
    pub inner: usize,
    pub dtype: DType,
}

impl Reduce {
    /// Elements of the output.
    pub(crate) fn outputs(&self) -> usize {
        self.outer * self.inner
    }
}

/// Fused multi-head self-attention over the output of a fused QKV projection:
/// `qkv: [batch, seq, 3, heads, head_dim]` (queries already scaled by `1/sqrt(head_dim)`),
/// `out[b, i, h, :] = softmax_j(q_bih . k_bjh, keys with mask[b, j] == 0 excluded) @ v_bjh`
/// written as `[batch, seq, heads * head_dim]`. `mask` is `F32` `[batch, seq]` of 1 (attend)
/// and 0 (padding); a row whose keys are all padding attends uniformly (as Hugging Face's
/// additive `f32::MIN` mask does). Softmax statistics are `f32`; no `[seq, seq]` score
/// matrix is stored.
///
/// Packed (`packed` set; `mask` is then `None`): `qkv` is `[tokens, 3, heads, head_dim]`
/// holding `batch` sequences back to back as [`SeqOffsets`] says, each attending only to
/// itself, `out` is `[tokens, heads * head_dim]`, and `seq` bounds every sequence's length
/// (a longer one is cut to `seq`: rows past it are left unwritten).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Attention {
    pub qkv: DevicePtr,
    pub mask: Option<DevicePtr>,
    pub packed: Option<SeqOffsets>,
    pub out: DevicePtr,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub dtype: DType,
}

/// RMS normalisation over the last axis of `[rows, cols]`:
/// `out = x / sqrt(mean(x^2) + eps) * gamma` (T5, Llama, Qwen), statistics in `f32` or
/// wider.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RmsNorm {
    pub x: DevicePtr,
    pub gamma: DevicePtr,
    pub out: DevicePtr,
    pub rows: usize,
    pub cols: usize,
    pub eps: f32,
    pub dtype: DType,
}

/// Rotary position embeddings, rotate-half (GPT-NeoX) form, on `x: [batch, seq, heads,
/// head_dim]`: with `p` the position of row `s` (`s` itself) and `h = head_dim / 2`,
/// `out[.., i] = x[i] cos[p, i] - x[i + h] sin[p, i]` and
/// `out[.., i + h] = x[i + h] cos[p, i] + x[i] sin[p, i]` for `i < h`, for heads
/// `0..rotated`; heads `rotated..heads` are copied unchanged (the values of a fused QKV
/// projection). `cos` and `sin` are `F32` `[positions >= seq, h]` tables.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub x: DevicePtr,
    pub cos: DevicePtr,
    pub sin: DevicePtr,
    pub out: DevicePtr,
    pub batch: usize,
    pub seq: usize,
    pub heads: usize,
    pub head_dim: usize,
    pub rotated: usize,
    pub dtype: DType,
}

impl Rope {
    /// Pairs `(i, i + head_dim / 2)` over every head of every row: one per two outputs
    /// (`head_dim` is even: the tensor layer refuses an odd one).
    pub(crate) fn pairs(&self) -> usize {
        self.batch * self.seq * self.heads * (self.head_dim / 2)
    }
}

/// Gated activation over a fused gate/up projection: `x: [rows, 2 * cols]` holds the gate
/// then the up values of each row; `out[r, c] = act(x[r, c]) * x[r, cols + c]`,
/// `out: [rows, cols]` (GeGLU / SwiGLU MLPs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GatedAct {
    pub x: DevicePtr,
    pub out: DevicePtr,
    pub rows: usize,
    pub cols: usize,
    pub act: GateActivation,
    pub dtype: DType,
}

/// Sentence pooling: `out[b, :] = normalize(sum_s mask[b, s] * x[b, s, :] / max(sum_s
/// mask[b, s], 1e-9))`, L2 norm floored at 1e-12 (sentence-transformers' mean pooling
/// and `normalize`). `x: [batch, seq, dim]` of `dtype`, `mask: [batch, seq]` `F32`;
/// `out: [batch, dim]` is always `F32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanPoolNorm {
    pub x: DevicePtr,
    pub mask: DevicePtr,
    pub out: DevicePtr,
    pub batch: usize,
    pub seq: usize,
    pub dim: usize,
    pub dtype: DType,
}

/// [`MeanPoolNorm`] over a packed batch: `out[b, :]` is the normalized mean of rows
/// `offsets[b]..offsets[b + 1]` of `x: [tokens, dim]` (an empty sequence gives zeros).
/// `out: [batch, dim]` is always `F32`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MeanPoolNormPacked {
    pub x: DevicePtr,
    pub seqs: SeqOffsets,
    pub out: DevicePtr,
    pub batch: usize,
    pub dim: usize,
    pub dtype: DType,
}

impl Kernel {
    /// The compute dtype of a floating-point kernel; `None` for the dtype-free ones (`Copy`,
    /// `Cast`, `Sleep`). Backends use it to pick or refuse a kernel in one place.
    pub fn float_dtype(&self) -> Option<DType> {
        let dtype = match self {
            Kernel::Fill(k) => k.dtype,
            Kernel::Matmul(k) => k.dtype,
            Kernel::Unary(k) => k.dtype,
            Kernel::Binary(k) => k.dtype,
            Kernel::Softmax(k) => k.dtype,
            Kernel::LayerNorm(k) => k.dtype,
            Kernel::BiasAct(k) => k.dtype,
            Kernel::IndexSelect(k) => k.dtype,
            Kernel::Reduce(k) => k.dtype,
            Kernel::Attention(k) => k.dtype,
            Kernel::MeanPoolNorm(k) => k.dtype,
            Kernel::RmsNorm(k) => k.dtype,
            Kernel::Rope(k) => k.dtype,
            Kernel::GatedAct(k) => k.dtype,
            Kernel::MeanPoolNormPacked(k) => k.dtype,
            Kernel::Copy(_) | Kernel::Cast(_) | Kernel::Sleep { .. } => return None,
        };
        Some(dtype)
    }

    /// Whether the kernel has nothing to compute (an empty output, or rows of no columns):
    /// every backend runs nothing for it. A `Matmul` with `k == 0` is not empty (its output
    /// is zeros); a `Sleep` never is.
    pub(crate) fn is_empty(&self) -> bool {
        match self {
            Kernel::Fill(k) => k.len == 0,
            Kernel::Cast(k) => k.len == 0,
            Kernel::Copy(k) => k.len() == 0,
            Kernel::Matmul(k) => k.batch == 0 || k.m == 0 || k.n == 0,
            Kernel::Unary(k) => k.len == 0,
            Kernel::Binary(k) => k.len() == 0,
            Kernel::Softmax(k) => k.rows == 0 || k.cols == 0,
            Kernel::LayerNorm(k) => k.rows == 0 || k.cols == 0,
            Kernel::BiasAct(k) => k.len() == 0,
            Kernel::IndexSelect(k) => k.len() == 0,
            Kernel::Sleep { .. } => false,
            Kernel::Reduce(k) => k.outputs() == 0,
            Kernel::Attention(k) => k.batch == 0 || k.seq == 0 || k.heads == 0 || k.head_dim == 0,
            Kernel::RmsNorm(k) => k.rows == 0 || k.cols == 0,
            Kernel::Rope(k) => k.pairs() == 0,
            Kernel::GatedAct(k) => k.rows == 0 || k.cols == 0,
            Kernel::MeanPoolNorm(k) => k.batch == 0 || k.dim == 0,
            Kernel::MeanPoolNormPacked(k) => k.batch == 0 || k.dim == 0,
        }
    }
}
