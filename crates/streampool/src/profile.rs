//! What a kernel profile is made of, whichever backend measured it: one [`KernelTime`] per
//! kernel and shape, labelled the same way by the CPU profile (`cpu/profile.rs`, host wall
//! time) and the wgpu one (`wgpu/profile.rs`, GPU timestamps), with the work each launch
//! does (floating-point operations, bytes moved) so a reader gets TFLOP/s and GB/s.

use crate::kernel::Kernel;

/// One line of a kernel profile ([`cpu_kernel_profile`](crate::cpu_kernel_profile), or the
/// wgpu profile's kernels): a kernel and shape, how often it ran, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTime {
    /// The kernel and its shape, e.g. `matmul f32 2048x1152x384 +bias`.
    pub label: String,
    /// Times it ran.
    pub calls: u64,
    /// Total time, nanoseconds: wall time on its stream's worker for the CPU (the pool's
    /// threads included), the compute pass between its two GPU timestamps for wgpu.
    pub total_ns: u128,
    /// Floating-point operations of all its calls (products and sums of matmuls and
    /// attention; 0 for the kernels counted in bytes).
    pub flops: u64,
    /// Bytes all its calls must read and write at the least (element-wise kernels, norms,
    /// copies; 0 for matmuls and attention).
    pub bytes: u64,
}

impl KernelTime {
    /// Its rate, as it reads best: `"12.3 TFLOP/s"` for counted operations, `"812 GB/s"`
    /// for counted bytes, empty when neither is counted or no time was measured.
    ///
    /// ```
    /// let k = streampool::KernelTime {
    ///     label: "matmul".into(), calls: 1, total_ns: 1_000, flops: 2_000_000_000, bytes: 0,
    /// };
    /// assert_eq!(k.rate(), "2000.0 TFLOP/s");
    /// ```
    pub fn rate(&self) -> String {
        let secs = self.total_ns as f64 / 1e9;
        if secs <= 0.0 {
            String::new()
        } else if self.flops > 0 {
            format!("{:.1} TFLOP/s", self.flops as f64 / secs / 1e12)
        } else if self.bytes > 0 {
            format!("{:.0} GB/s", self.bytes as f64 / secs / 1e9)
        } else {
            String::new()
        }
    }
}

/// `(flops, bytes)` one launch of `k` does: operations for matmuls and attention, the bytes
/// it must read and write for the memory-bound kernels.
pub(crate) fn work(k: &Kernel) -> (u64, u64) {
    let e = k.float_dtype().map_or(4, |d| d.size()) as u64;
    let n = |v: usize| v as u64;
    match k {
        Kernel::Matmul {
            batch, m, n: nn, k, ..
        } => (2 * n(*batch) * n(*m) * n(*nn) * n(*k), 0),
        // QK^T and PV: 2 * 2 * seq^2 * head_dim per sequence and head.
        Kernel::Attention {
            batch,
            seq,
            heads,
            head_dim,
            ..
        } => (
            4 * n(*batch) * n(*heads) * n(*seq) * n(*seq) * n(*head_dim),
            0,
        ),
        Kernel::LayerNorm {
            rows,
            cols,
            residual,
            ..
        } => (
            0,
            n(rows * cols) * e * if residual.is_some() { 3 } else { 2 },
        ),
        Kernel::BiasAct { rows, cols, .. } | Kernel::Softmax { rows, cols, .. } => {
            (0, 2 * n(rows * cols) * e)
        }
        Kernel::Unary { len, .. } | Kernel::Fill { len, .. } => (0, 2 * n(*len) * e),
        Kernel::Binary { shape, .. } => (0, 3 * n(shape.iter().product()) * e),
        Kernel::Copy {
            shape, elem_size, ..
        } => (0, 2 * n(shape.iter().product()) * n(*elem_size)),
        Kernel::Cast { len, from, to, .. } => (0, n(*len) * n(from.size() + to.size())),
        Kernel::IndexSelect { n_ids, row_len, .. } => (0, 2 * n(n_ids * row_len) * e),
        Kernel::MeanPoolNorm {
            batch, seq, dim, ..
        } => (0, n(batch * seq * dim) * e),
        _ => (0, 0),
    }
}

/// The kernel and its shape, as a profile line names it.
pub(crate) fn label(k: &Kernel) -> String {
    let dt =
        |d: Option<crate::DType>| d.map_or(String::new(), |d| format!(" {d:?}").to_lowercase());
    let d = dt(k.float_dtype());
    match k {
        Kernel::Matmul {
            batch,
            m,
            n,
            k,
            bias,
            act,
            math,
            ..
        } => format!(
            "matmul{} {}{m}x{n}x{k}{}",
            if *math == crate::MatmulMath::Int8 {
                " int8".to_string()
            } else {
                d
            },
            if *batch > 1 {
                format!("{batch}x ")
            } else {
                String::new()
            },
            match (bias.is_some(), act) {
                (false, _) => String::new(),
                (true, crate::Activation::Identity) => " +bias".into(),
                (true, act) => format!(" +bias {act:?}"),
            }
        ),
        Kernel::Attention {
            batch,
            seq,
            heads,
            head_dim,
            mask,
            ..
        } => format!(
            "attention{d} b{batch} s{seq} h{heads} d{head_dim}{}",
            if mask.is_some() { " masked" } else { "" }
        ),
        Kernel::LayerNorm {
            rows,
            cols,
            residual,
            ..
        } => format!(
            "layer_norm{d} {rows}x{cols}{}",
            if residual.is_some() { " +residual" } else { "" }
        ),
        Kernel::BiasAct {
            rows, cols, act, ..
        } => format!("bias_act{d} {act:?} {rows}x{cols}"),
        Kernel::Softmax { rows, cols, .. } => format!("softmax{d} {rows}x{cols}"),
        Kernel::Unary { op, len, .. } => format!("unary{d} {op:?} {len}"),
        Kernel::Binary { op, shape, .. } => format!("binary{d} {op:?} {shape:?}"),
        Kernel::Copy { shape, .. } => format!("copy {shape:?}"),
        Kernel::Cast { len, from, to, .. } => format!("cast {from:?}->{to:?} {len}"),
        Kernel::Fill { len, .. } => format!("fill{d} {len}"),
        Kernel::IndexSelect { n_ids, row_len, .. } => {
            format!("index_select{d} {n_ids}x{row_len}")
        }
        Kernel::Reduce {
            op,
            outer,
            axis,
            inner,
            ..
        } => format!("reduce{d} {op:?} {outer}x{axis}x{inner}"),
        Kernel::MeanPoolNorm {
            batch, seq, dim, ..
        } => format!("mean_pool_norm{d} b{batch} s{seq} d{dim}"),
        Kernel::Sleep { .. } => "sleep".into(),
        // Kernels without a shape summary of their own: the variant's name.
        other => {
            let debug = format!("{other:?}");
            let name = debug.split([' ', '{']).next().unwrap_or("kernel");
            format!("{}{d}", name.to_lowercase())
        }
    }
}
