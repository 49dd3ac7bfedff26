//! Backend-neutral descriptions of the operations a backend must run.
//!
//! The tensor layer checks shapes, dtypes and devices, allocates outputs and then describes
//! the work as one of these values. Compute is in `f32` (indices are `i64`). All sizes and
//! strides are in elements; every output is contiguous and row-major.

use crate::device_ptr::DevicePtr;

/// A strided view of an `f32` (or, for `Copy`, any-width) input: element `idx` (a multi-index
/// over the kernel's shape) lives at `ptr + sum(idx[d] * strides[d]) * elem_size`. A broadcast
/// dimension has stride 0.
#[derive(Debug, Clone, PartialEq)]
pub struct Strided {
    pub ptr: DevicePtr,
    pub strides: Vec<usize>,
}

/// One matmul operand of shape `[batch, rows, cols]`: element `(b, r, c)` is at
/// `ptr + (b * batch_stride + r * rs + c * cs) * 4`. Either `rs` or `cs` is 1 (backends
/// such as cuBLAS need one unit stride); `batch_stride` may be 0 (broadcast).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MatOperand {
    pub ptr: DevicePtr,
    pub batch_stride: usize,
    pub rs: usize,
    pub cs: usize,
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

/// Element-wise functions of two arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Max,
}

/// Reductions over one axis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
}

/// Activation applied by the fused bias kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    Identity,
    Relu,
    Gelu,
}

/// One unit of device work.
#[derive(Debug, Clone, PartialEq)]
pub enum Kernel {
    /// `out[i] = value` for `len` f32 elements.
    Fill {
        out: DevicePtr,
        len: usize,
        value: f32,
    },
    /// Gathers a strided view of `shape` into contiguous `out`; `elem_size` bytes per element.
    Copy {
        src: Strided,
        shape: Vec<usize>,
        out: DevicePtr,
        elem_size: usize,
    },
    /// `out[b] = a[b] @ b[b]` with `a: [batch, m, k]`, `b: [batch, k, n]`, `out: [batch, m, n]`.
    Matmul {
        a: MatOperand,
        b: MatOperand,
        out: DevicePtr,
        batch: usize,
        m: usize,
        n: usize,
        k: usize,
    },
    /// `out[i] = op(x[i])` over `len` contiguous elements.
    Unary {
        op: UnaryOp,
        x: DevicePtr,
        out: DevicePtr,
        len: usize,
    },
    /// `out[idx] = op(a[idx], b[idx])` over `shape`, with broadcasting through zero strides.
    Binary {
        op: BinaryOp,
        a: Strided,
        b: Strided,
        shape: Vec<usize>,
        out: DevicePtr,
    },
    /// Softmax over the last axis of a contiguous `[rows, cols]`.
    Softmax {
        x: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
    },
    /// `out = layer_norm(x + residual) * gamma + beta` over the last axis of `[rows, cols]`;
    /// `residual` is optional (the fused residual + LayerNorm of post-norm transformers).
    LayerNorm {
        x: DevicePtr,
        residual: Option<DevicePtr>,
        gamma: DevicePtr,
        beta: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        eps: f32,
    },
    /// `out = act(x + bias)` with `x: [rows, cols]` and `bias: [cols]` (fused bias + activation).
    BiasAct {
        x: DevicePtr,
        bias: DevicePtr,
        out: DevicePtr,
        rows: usize,
        cols: usize,
        act: Activation,
    },
    /// `out[i, :] = table[ids[i], :]`; `ids` are `i64`; ids outside `0..table_rows` give zero rows.
    IndexSelect {
        table: DevicePtr,
        ids: DevicePtr,
        out: DevicePtr,
        n_ids: usize,
        row_len: usize,
        table_rows: usize,
    },
    /// Keeps the stream busy for `nanos` nanoseconds (tests use it to make a stream slow on
    /// purpose, to prove cross-stream ordering).
    Sleep { nanos: u64 },
    /// Reduces the middle axis of a contiguous `[outer, axis, inner]` into `[outer, inner]`.
    Reduce {
        op: ReduceOp,
        x: DevicePtr,
        out: DevicePtr,
        outer: usize,
        axis: usize,
        inner: usize,
    },
}
