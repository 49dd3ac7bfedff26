//! Opt-in timing of every CPU kernel (`STREAMPOOL_CPU_PROFILE=1`): where a CPU forward
//! spends its time, per kernel and shape, without an external profiler (the GPU machine's
//! host has none). Off, it costs one relaxed atomic load per kernel.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Instant;

use crate::kernel::Kernel;
use parking_lot::Mutex;

/// Environment variable that turns the profile on (`1`).
pub const CPU_PROFILE_ENV: &str = "STREAMPOOL_CPU_PROFILE";

/// 0: not read yet, 1: off, 2: on.
static STATE: AtomicU8 = AtomicU8::new(0);

/// Totals per kernel label. Locked once per kernel, only while profiling, never while a
/// kernel runs. `parking_lot` directly (not the `sync` shim): a `const` static, and not part
/// of what the loom models check.
static TOTALS: Mutex<Option<HashMap<String, (u64, u128)>>> = Mutex::new(None);

fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => {
            let on = std::env::var(CPU_PROFILE_ENV).is_ok_and(|v| v == "1");
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            on
        }
    }
}

/// Runs `f` (the kernel `k`), timing it when profiling is on.
pub(crate) fn timed(k: &Kernel, f: impl FnOnce()) {
    if !enabled() {
        return f();
    }
    let start = Instant::now();
    f();
    let ns = start.elapsed().as_nanos();
    let mut totals = TOTALS.lock();
    let e = totals
        .get_or_insert_with(HashMap::new)
        .entry(label(k))
        .or_insert((0, 0));
    e.0 += 1;
    e.1 += ns;
}

/// One line of [`cpu_kernel_profile`]: a kernel and shape, how often it ran, for how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelTime {
    /// The kernel and its shape, e.g. `matmul f32 2048x1152x384 +bias`.
    pub label: String,
    /// Times it ran.
    pub calls: u64,
    /// Total wall time on its stream's worker (the pool's threads included), nanoseconds.
    pub total_ns: u128,
}

/// The CPU kernel profile so far, longest total first, and resets it. Empty unless
/// `STREAMPOOL_CPU_PROFILE=1` was set when the first kernel ran.
///
/// ```
/// let profile = streampool::cpu_kernel_profile();
/// assert!(profile.iter().all(|k| k.calls > 0));
/// ```
pub fn cpu_kernel_profile() -> Vec<KernelTime> {
    let mut v: Vec<KernelTime> = TOTALS
        .lock()
        .take()
        .unwrap_or_default()
        .into_iter()
        .map(|(label, (calls, total_ns))| KernelTime {
            label,
            calls,
            total_ns,
        })
        .collect();
    v.sort_by_key(|k| std::cmp::Reverse(k.total_ns));
    v
}

fn label(k: &Kernel) -> String {
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
            ..
        } => format!(
            "matmul{d} {}{m}x{n}x{k}{}",
            if *batch > 1 {
                format!("{batch}x ")
            } else {
                String::new()
            },
            if bias.is_some() { " +bias" } else { "" }
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
