//! `streampool bench`: forward throughput of a small MLP from 1 to N threads.

use std::time::{Duration, Instant};

use anyhow::Result;
use streampool::{Activation, Device, Tensor};

/// Arguments of `streampool bench`.
#[derive(clap::Args)]
pub struct Args {
    /// Device to run on: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Thread counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8,16")]
    threads: Vec<usize>,
    /// Rows per forward call.
    #[arg(long, default_value_t = 1)]
    batch: usize,
    /// Seconds measured per thread count (after a short warm-up).
    #[arg(long, default_value_t = 2.0)]
    seconds: f64,
}

/// The benchmark MLP: 256 -> 1024 (GELU) -> 256, weights shared by all threads.
struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    fn new(dev: &Device) -> Result<Self> {
        Ok(Self {
            w1: Tensor::randn(&[256, 1024], 1, dev)?.scale(1.0 / 16.0)?,
            b1: Tensor::randn(&[1024], 2, dev)?,
            w2: Tensor::randn(&[1024, 256], 3, dev)?.scale(1.0 / 32.0)?,
            b2: Tensor::randn(&[256], 4, dev)?,
        })
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.matmul(&self.w1)?.bias_act(&self.b1, Activation::Gelu)?;
        Ok(h.matmul(&self.w2)?
            .bias_act(&self.b2, Activation::Identity)?)
    }
}

/// Runs the thread sweep and prints a table.
pub fn run(args: Args) -> Result<()> {
    let dev = super::device::open(&args.device)?;
    let mlp = Mlp::new(&dev)?;
    dev.synchronize()?;
    println!(
        "MLP 256-1024-GELU-256, batch {}, device {}, {:.1} s per point",
        args.batch,
        dev.name(),
        args.seconds
    );
    println!("{:>8} {:>14} {:>10}", "threads", "forwards/s", "speedup");
    let mut base = None;
    for &threads in &args.threads {
        let rate = measure(
            &dev,
            &mlp,
            threads,
            args.batch,
            Duration::from_secs_f64(args.seconds),
        )?;
        let base = *base.get_or_insert(rate);
        println!("{threads:>8} {rate:>14.0} {:>9.2}x", rate / base);
    }
    Ok(())
}

/// Forwards per second with `threads` threads each calling the shared model in a loop and
/// reading every result back (so the work is really done, not just queued).
fn measure(dev: &Device, mlp: &Mlp, threads: usize, batch: usize, window: Duration) -> Result<f64> {
    let x = Tensor::randn(&[batch, 256], 9, dev)?;
    let deadline = Instant::now() + Duration::from_millis(200) + window;
    let warm_until = Instant::now() + Duration::from_millis(200);
    let counts = std::thread::scope(|s| -> Result<Vec<u64>> {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let x = x.clone();
                s.spawn(move || -> Result<u64> {
                    let mut n = 0u64;
                    loop {
                        let now = Instant::now();
                        if now >= deadline {
                            return Ok(n);
                        }
                        mlp.forward(&x)?.to_vec::<f32>()?;
                        if now >= warm_until {
                            n += 1;
                        }
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .map_err(|_| anyhow::anyhow!("bench thread panicked"))?
            })
            .collect()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / window.as_secs_f64())
}
