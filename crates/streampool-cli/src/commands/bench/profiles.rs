//! The opt-in kernel profiles printed after each bench point: `STREAMPOOL_CPU_PROFILE=1`
//! (host time per CPU kernel) and `STREAMPOOL_WGPU_PROFILE=1` (GPU time per wgpu kernel
//! from timestamps, the GPU's idle time between passes, and host time per call phase; `host`:
//! the phases only). Each covers the point's warm-up too; empty profiles print nothing.

use indicatif::ProgressBar;

/// Lines of each kernel table.
const TOP: usize = 16;

/// Prints (and resets) the profiles gathered since the last call.
pub(super) fn print(bar: &ProgressBar) {
    let out = |line: String| bar.suspend(|| eprintln!("{line}"));
    let cpu = streampool::cpu_kernel_profile();
    let total: u128 = cpu.iter().map(|k| k.total_ns).sum();
    for k in cpu.iter().take(TOP) {
        out(line(k, total));
    }
    #[cfg(feature = "wgpu")]
    {
        let p = streampool::wgpu_profile();
        for a in &p.unsupported {
            out(format!(
                "      wgpu profile: {a} has no TIMESTAMP_QUERY: no kernel times (host phases only)"
            ));
        }
        if p.stretches > 0 {
            let idle = p.span_ns.saturating_sub(p.busy_ns);
            out(format!(
                "      wgpu GPU: {:.3} ms in kernels of {:.3} ms spanned ({} stretches between host waits): {:.3} ms ({:.1}%) between passes{}",
                p.busy_ns as f64 / 1e6,
                p.span_ns as f64 / 1e6,
                p.stretches,
                idle as f64 / 1e6,
                100.0 * idle as f64 / p.span_ns.max(1) as f64,
                if p.untimed > 0 { format!(", {} passes untimed", p.untimed) } else { String::new() }
            ));
        }
        for k in p.kernels.iter().take(TOP) {
            out(line(k, p.busy_ns));
        }
        if !p.host.is_empty() {
            out("      wgpu host phases (mean per call):".into());
        }
        for k in &p.host {
            out(format!(
                "      {:>9.1} us {:>8} x  {}",
                k.total_ns as f64 / 1e3 / k.calls.max(1) as f64,
                k.calls,
                k.label
            ));
        }
    }
}

fn line(k: &streampool::KernelTime, total: u128) -> String {
    format!(
        "      {:5.1}% {:>9.3} ms {:>7} x {:>13}  {}",
        100.0 * k.total_ns as f64 / total.max(1) as f64,
        k.total_ns as f64 / 1e6,
        k.calls,
        k.rate(),
        k.label
    )
}
