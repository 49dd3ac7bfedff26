//! GPU time of single CUDA kernels at the shapes MiniLM runs them, and of variants of their
//! launch configuration, so a tuning choice in `cuda/kernels.rs` rests on a measurement.
//!
//! It compiles `src/cuda/kernels.cu` (the library's own source) with NVRTC, plus wrappers
//! that instantiate the same templates under other `__launch_bounds__`, and times each
//! variant with CUDA events: 5 warm-up launches, then the median of 7 runs of 20 launches.
//! Every variant's output is compared with the library kernel's (they compute the same
//! thing, so they must agree exactly), and a mismatch fails the run.
//!
//! Rows:
//! - `attention`: the tensor-core attention (`attention_mma_k`) on a `[batch, seq, 3, 12, d]`
//!   f16 input, per (seq, head width): the library kernel (4 warps per block, launch bounds)
//!   against the same template without bounds at 8 and 4 warps.
//! - `bias_gelu`: bias + GELU on `[rows, 1536]` f16 (MiniLM's intermediate layer): the 4-wide
//!   kernel against the row kernel at several grid sizes. GB/s counts one read and one write.
//!
//! `cargo run --release -p streampool --features cuda --example kernel_bench [--json FILE]`
//! (GPU 0; `KERNEL_BENCH_BATCH` sets the batch, default 512).

use std::time::Instant;

use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions};
use std::sync::Arc;

const SOURCE: &str = include_str!("../src/cuda/kernels.cu");

/// The library's attention template without launch bounds (the compiler's register choice),
/// to compare with the library's bounded kernels: only register allocation, occupancy and
/// block size differ.
const VARIANTS: &str = r#"
extern "C" __global__ void kb_attn32_free(const void* q, const float* m, const i64* off, void* o, int s, int h, i64 t) { attention_mma_k<F16, 32>(q, m, off, o, s, h, t); }
extern "C" __global__ void kb_attn64_free(const void* q, const float* m, const i64* off, void* o, int s, int h, i64 t) { attention_mma_k<F16, 64>(q, m, off, o, s, h, t); }
"#;

type BoxError = Box<dyn std::error::Error>;

struct Bench {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<cudarc::driver::CudaModule>,
}

impl Bench {
    fn func(&self, name: &str) -> Result<CudaFunction, BoxError> {
        Ok(self.module.load_function(name)?)
    }

    /// Median GPU milliseconds of one launch, timing runs of 20 launches with events.
    fn time(&self, mut launch: impl FnMut() -> Result<(), BoxError>) -> Result<f64, BoxError> {
        for _ in 0..5 {
            launch()?;
        }
        let mut runs = Vec::new();
        for _ in 0..7 {
            let start = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            let end = self
                .ctx
                .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            start.record(&self.stream)?;
            for _ in 0..20 {
                launch()?;
            }
            end.record(&self.stream)?;
            runs.push(f64::from(start.elapsed_ms(&end)?) / 20.0);
        }
        runs.sort_by(f64::total_cmp);
        Ok(runs[runs.len() / 2])
    }
}

/// Pseudo-random f16 bits in [-2, 2), reproducible without a RNG dependency.
fn halves(n: usize, seed: u64) -> Vec<u16> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 11) as f64 / (1u64 << 53) as f64;
            half::f16::from_f64(u * 4.0 - 2.0).to_bits()
        })
        .collect()
}

struct Row {
    kind: &'static str,
    shape: String,
    variant: String,
    us: f64,
    gbps: f64,
}

fn attention(b: &Bench, batch: usize, rows: &mut Vec<Row>) -> Result<(), BoxError> {
    let heads = 12usize;
    for (seq, hd) in [(32usize, 32usize), (128, 32), (128, 64)] {
        let qkv_len = batch * seq * 3 * heads * hd;
        let out_len = batch * seq * heads * hd;
        let qkv = b.stream.clone_htod(&halves(qkv_len, 7))?;
        let mask = b.stream.clone_htod(&vec![1.0f32; batch * seq])?;
        let mut reference: Option<Vec<u16>> = None;
        let lib = format!("sp_attention_mma{hd}_f16");
        let free = format!("kb_attn{hd}_free");
        let variants: Vec<(String, String, u32)> = vec![
            (
                "library (4 warps, launch bounds)".to_string(),
                lib.clone(),
                4,
            ),
            ("no launch bounds, 8 warps".to_string(), free.clone(), 8),
            ("no launch bounds, 4 warps".to_string(), free, 4),
        ];
        for (label, name, warps) in variants {
            let f = b.func(&name)?;
            let mut out: CudaSlice<u16> = b.stream.alloc_zeros(out_len)?;
            let warps = warps.min(seq.div_ceil(16) as u32);
            let cfg = LaunchConfig {
                grid_dim: (
                    seq.div_ceil(16 * warps as usize) as u32,
                    heads as u32,
                    batch as u32,
                ),
                block_dim: (32 * warps, 1, 1),
                shared_mem_bytes: 0,
            };
            let (s, h, no_offsets, tokens) = (seq as i32, heads as i32, 0u64, 0i64);
            let ms = b.time(|| {
                let mut l = b.stream.launch_builder(&f);
                l.arg(&qkv)
                    .arg(&mask)
                    .arg(&no_offsets)
                    .arg(&mut out)
                    .arg(&s)
                    .arg(&h)
                    .arg(&tokens);
                // SAFETY: the argument list matches attention_mma_k's (qkv, mask, offsets
                // (null: padded), out, seq, heads, tokens) and the buffers hold
                // [batch, seq, 3, heads, hd] and [batch, seq, heads, hd].
                unsafe { l.launch(cfg) }?;
                Ok(())
            })?;
            let got = b.stream.clone_dtoh(&out)?;
            match &reference {
                None => reference = Some(got),
                Some(r) if *r != got => {
                    return Err(format!("attention {label}: output differs").into())
                }
                Some(_) => {}
            }
            let bytes = (qkv_len + out_len) as f64 * 2.0;
            rows.push(Row {
                kind: "attention",
                shape: format!("{batch}x{seq} tokens, 12 heads x {hd}"),
                variant: label,
                us: ms * 1e3,
                gbps: bytes / (ms * 1e-3) / 1e9,
            });
        }
    }
    Ok(())
}

fn bias_gelu(b: &Bench, batch: usize, rows: &mut Vec<Row>) -> Result<(), BoxError> {
    let cols = 1536usize;
    for seq in [32usize, 128] {
        let n_rows = batch * seq;
        let n = n_rows * cols;
        let x = b.stream.clone_htod(&halves(n, 3))?;
        let bias = b.stream.clone_htod(&halves(cols, 5))?;
        let mut reference: Option<Vec<u16>> = None;
        let rows8 = b.func("sp_bias_act_rows8_f16")?;
        let four = b.func("sp_bias_act4_f16")?;
        let gelu = 2i32;
        let mut configs: Vec<(String, u32)> =
            vec![("bias_act4 (256 threads, grid-stride)".into(), 0)];
        for grid in [n_rows.div_ceil(2).min(65_535) as u32, 8192, 2048] {
            configs.push((format!("rows8, grid {grid}"), grid));
        }
        for (label, grid) in configs {
            let mut out: CudaSlice<u16> = b.stream.alloc_zeros(n)?;
            let ms = if grid == 0 {
                let (n4, c4) = ((n / 4) as u32, (cols / 4) as u32);
                let cfg = LaunchConfig {
                    grid_dim: ((n / 4).div_ceil(256).min(65_535) as u32, 1, 1),
                    block_dim: (256, 1, 1),
                    shared_mem_bytes: 0,
                };
                b.time(|| {
                    let mut l = b.stream.launch_builder(&four);
                    l.arg(&x)
                        .arg(&bias)
                        .arg(&mut out)
                        .arg(&n4)
                        .arg(&c4)
                        .arg(&gelu);
                    // SAFETY: matches bias_act4_k(x, bias, out, n4, cols4, act).
                    unsafe { l.launch(cfg) }?;
                    Ok(())
                })?
            } else {
                let (r32, c8) = (n_rows as u32, (cols / 8) as u32);
                let cfg = LaunchConfig {
                    grid_dim: (grid, 1, 1),
                    block_dim: (c8.div_ceil(32) * 32, 1, 1),
                    shared_mem_bytes: 0,
                };
                b.time(|| {
                    let mut l = b.stream.launch_builder(&rows8);
                    l.arg(&x)
                        .arg(&bias)
                        .arg(&mut out)
                        .arg(&r32)
                        .arg(&c8)
                        .arg(&gelu);
                    // SAFETY: matches bias_act_rows8_k(x, bias, out, rows, cols8, act).
                    unsafe { l.launch(cfg) }?;
                    Ok(())
                })?
            };
            let got = b.stream.clone_dtoh(&out)?;
            match &reference {
                None => reference = Some(got),
                Some(r) if *r != got => {
                    return Err(format!("bias_gelu {label}: output differs").into())
                }
                Some(_) => {}
            }
            rows.push(Row {
                kind: "bias_gelu",
                shape: format!("{n_rows}x{cols}"),
                variant: label,
                us: ms * 1e3,
                gbps: 2.0 * n as f64 * 2.0 / (ms * 1e-3) / 1e9,
            });
        }
    }
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("kernel_bench [--json FILE]: GPU time of attention and bias+GELU kernel variants at MiniLM's shapes (GPU 0; KERNEL_BENCH_BATCH, default 512)");
        return Ok(());
    }
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    let batch: usize = std::env::var("KERNEL_BENCH_BATCH")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(512);
    let ctx = CudaContext::new(0)?;
    // The bench times kernels, not cudarc's per-buffer event bookkeeping.
    // SAFETY: one stream only, so no cross-stream ordering is needed.
    unsafe { ctx.disable_event_tracking() };
    let arch = match ctx.compute_capability()? {
        (8, 0) => "compute_80",
        (8, 6) => "compute_86",
        (8, 9) => "compute_89",
        (9, 0) => "compute_90",
        (10, 0) => "compute_100",
        (12, 0) => "compute_120",
        other => {
            return Err(format!("compute capability {other:?}: mma attention needs sm_80+").into())
        }
    };
    let t = Instant::now();
    let ptx = compile_ptx_with_opts(
        format!("{SOURCE}\n{VARIANTS}"),
        CompileOptions {
            arch: Some(arch),
            ..Default::default()
        },
    )?;
    eprintln!("NVRTC compile {:.1} s", t.elapsed().as_secs_f64());
    let module = ctx.load_module(ptx)?;
    let stream = ctx.new_stream()?;
    let bench = Bench {
        ctx,
        stream,
        module,
    };
    let mut rows = Vec::new();
    attention(&bench, batch, &mut rows)?;
    bias_gelu(&bench, batch, &mut rows)?;
    println!("| kernel | shape | variant | us per launch | GB/s |");
    println!("|---|---|---|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1} | {:.0} |",
            r.kind, r.shape, r.variant, r.us, r.gbps
        );
    }
    if let Some(path) = json {
        let items: Vec<String> = rows
            .iter()
            .map(|r| {
                format!(
                    "{{\"kernel\":\"{}\",\"shape\":\"{}\",\"variant\":\"{}\",\"us\":{:.2},\"gbps\":{:.1}}}",
                    r.kind, r.shape, r.variant, r.us, r.gbps
                )
            })
            .collect();
        std::fs::write(&path, format!("[{}]\n", items.join(",\n")))?;
    }
    Ok(())
}
