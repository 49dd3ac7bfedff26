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
        Kernel::Matmul(p) => (2 * n(p.batch) * n(p.m) * n(p.n) * n(p.k), 0),
        // QK^T and PV: 2 * 2 * seq^2 * head_dim per sequence and head.
        Kernel::Attention(p) => (
            4 * n(p.batch) * n(p.heads) * n(p.seq) * n(p.seq) * n(p.head_dim),
            0,
        ),
        Kernel::LayerNorm(p) => (
            0,
            n(p.rows * p.cols) * e * if p.residual.is_some() { 3 } else { 2 },
        ),
        Kernel::BiasAct(p) => (0, 2 * n(p.len()) * e),
        Kernel::Softmax(p) => (0, 2 * n(p.rows * p.cols) * e),
        Kernel::Unary(p) => (0, 2 * n(p.len) * e),
        Kernel::Fill(p) => (0, 2 * n(p.len) * e),
        Kernel::Binary(p) => (0, 3 * n(p.len()) * e),
        Kernel::Copy(p) => (0, 2 * n(p.len()) * n(p.elem_size)),
        Kernel::Cast(p) => (0, n(p.len) * n(p.from.size() + p.to.size())),
        Kernel::IndexSelect(p) => (0, 2 * n(p.len()) * e),
        Kernel::MeanPoolNorm(p) => (0, n(p.batch * p.seq * p.dim) * e),
        _ => (0, 0),
    }
}

/// The kernel and its shape, as a profile line names it.
pub(crate) fn label(k: &Kernel) -> String {
    let dt =
        |d: Option<crate::DType>| d.map_or(String::new(), |d| format!(" {d:?}").to_lowercase());
    let d = dt(k.float_dtype());
    match k {
        Kernel::Matmul(p) => format!(
            "matmul{} {}{}x{}x{}{}",
            if p.math == crate::MatmulMath::Int8 {
                " int8".to_string()
            } else {
                d
            },
            if p.batch > 1 {
                format!("{}x ", p.batch)
            } else {
                String::new()
            },
            p.m,
            p.n,
            p.k,
            match (p.bias.is_some(), p.act) {
                (false, _) => String::new(),
                (true, crate::Activation::Identity) => " +bias".into(),
                (true, act) => format!(" +bias {act:?}"),
            }
        ),
        Kernel::Attention(p) => format!(
            "attention{d} b{} s{} h{} d{}{}",
            p.batch,
            p.seq,
            p.heads,
            p.head_dim,
            if p.mask.is_some() { " masked" } else { "" }
        ),
        Kernel::LayerNorm(p) => format!(
            "layer_norm{d} {}x{}{}",
            p.rows,
            p.cols,
            if p.residual.is_some() {
                " +residual"
            } else {
                ""
            }
        ),
        Kernel::BiasAct(p) => format!("bias_act{d} {:?} {}x{}", p.act, p.rows, p.cols),
        Kernel::Softmax(p) => format!("softmax{d} {}x{}", p.rows, p.cols),
        Kernel::Unary(p) => format!("unary{d} {:?} {}", p.op, p.len),
        Kernel::Binary(p) => format!("binary{d} {:?} {:?}", p.op, p.shape),
        Kernel::Copy(p) => format!("copy {:?}", p.shape),
        Kernel::Cast(p) => format!("cast {:?}->{:?} {}", p.from, p.to, p.len),
        Kernel::Fill(p) => format!("fill{d} {}", p.len),
        Kernel::IndexSelect(p) => format!("index_select{d} {}x{}", p.n_ids, p.row_len),
        Kernel::Reduce(p) => format!("reduce{d} {:?} {}x{}x{}", p.op, p.outer, p.axis, p.inner),
        Kernel::MeanPoolNorm(p) => {
            format!("mean_pool_norm{d} b{} s{} d{}", p.batch, p.seq, p.dim)
        }
        Kernel::Sleep { .. } => "sleep".into(),
        // Kernels without a shape summary of their own: the variant's name.
        other => {
            let debug = format!("{other:?}");
            let name = debug.split([' ', '{', '(']).next().unwrap_or("kernel");
            format!("{}{d}", name.to_lowercase())
        }
    }
}
