//! Where a small-MLP forward's time goes on CUDA, and which parts scale with threads.
//!
//! Each row runs one unit of work in a loop on every thread (each thread on its own pooled
//! stream) and reports operations per second at 1, 8 and 16 threads. Run on a GPU machine:
//! `cargo run --release --features cuda --example cuda_profile`.

use std::time::{Duration, Instant};

use streampool::{Activation, Device, Result, Tensor};

struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let h = x.matmul(&self.w1)?.bias_act(&self.b1, Activation::Gelu)?;
        h.matmul(&self.w2)?.bias_act(&self.b2, Activation::Identity)
    }
}

/// A unit of work: runs once per call and returns how many operations it did.
type Unit = fn(&Device, &Mlp, &Tensor) -> Result<u64>;

fn sync(dev: &Device) -> Result<()> {
    dev.current_stream()?.synchronize()
}

const UNITS: &[(&str, Unit)] = &[
    ("bare kernel launch (x100, 1 sync)", |d, _, _| {
        let s = d.current_stream()?;
        for _ in 0..100 {
            s.debug_delay(Duration::ZERO)?;
        }
        s.synchronize()?;
        Ok(100)
    }),
    ("event record (x100, 1 sync)", |d, _, _| {
        let s = d.current_stream()?;
        for _ in 0..100 {
            s.record_event()?;
        }
        s.synchronize()?;
        Ok(100)
    }),
    ("relu [1,256] launch (x100, 1 sync)", |d, _, x| {
        for _ in 0..100 {
            x.relu()?;
        }
        sync(d)?;
        Ok(100)
    }),
    ("bias_act [1,1024] launch (x100, 1 sync)", |d, m, _| {
        let h = Tensor::zeros(&[1, 1024], d)?;
        for _ in 0..100 {
            h.bias_act(&m.b1, Activation::Gelu)?;
        }
        sync(d)?;
        Ok(100)
    }),
    ("matmul 1x256x1024 cuBLAS (x20, 1 sync)", |d, m, x| {
        for _ in 0..20 {
            x.matmul(&m.w1)?;
        }
        sync(d)?;
        Ok(20)
    }),
    ("to_vec [1,256] (device->host + wait)", |_, _, x| {
        x.to_vec::<f32>()?;
        Ok(1)
    }),
    ("from_vec [1,256] (host->device, x10, 1 sync)", |d, _, _| {
        for _ in 0..10 {
            Tensor::from_vec(vec![0.5f32; 256], &[1, 256], d)?;
        }
        sync(d)?;
        Ok(10)
    }),
    ("forward + stream sync (no copy)", |d, m, x| {
        m.forward(x)?;
        sync(d)?;
        Ok(1)
    }),
    ("forward x10 + one to_vec", |_, m, x| {
        let mut y = m.forward(x)?;
        for _ in 0..9 {
            y = m.forward(x)?;
        }
        y.to_vec::<f32>()?;
        Ok(10)
    }),
    ("forward + to_vec", |_, m, x| {
        m.forward(x)?.to_vec::<f32>()?;
        Ok(1)
    }),
    (
        "from_vec + forward + to_vec (the bench's call)",
        |d, m, _| {
            let x = Tensor::from_vec(vec![0.5f32; 256], &[1, 256], d)?;
            m.forward(&x)?.to_vec::<f32>()?;
            Ok(1)
        },
    ),
];

fn rate(dev: &Device, mlp: &Mlp, unit: Unit, threads: usize, window: Duration) -> Result<f64> {
    let start = Instant::now() + Duration::from_millis(100);
    let end = start + window;
    let counts = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(move || -> Result<u64> {
                    let x = Tensor::randn(&[1, 256], 7, dev)?;
                    let mut n = 0;
                    loop {
                        let now = Instant::now();
                        if now >= end {
                            return Ok(n);
                        }
                        let done = unit(dev, mlp, &x)?;
                        if now >= start {
                            n += done;
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("profile thread"))
            .collect::<Result<Vec<u64>>>()
    })?;
    Ok(counts.iter().sum::<u64>() as f64 / window.as_secs_f64())
}

fn main() -> Result<()> {
    let dev = Device::cuda(0)?;
    let mlp = Mlp {
        w1: Tensor::randn(&[256, 1024], 1, &dev)?,
        b1: Tensor::randn(&[1024], 2, &dev)?,
        w2: Tensor::randn(&[1024, 256], 3, &dev)?,
        b2: Tensor::randn(&[256], 4, &dev)?,
    };
    dev.synchronize()?;
    let staging = std::env::var("STREAMPOOL_CUDA_STAGING").unwrap_or_else(|_| "1".into());
    println!(
        "cuda_profile on {} (STREAMPOOL_CUDA_STAGING={staging}), ops/s",
        dev.name()
    );
    println!(
        "{:<44} {:>10} {:>10} {:>10} {:>8}",
        "unit", "1 thread", "8", "16", "8 / 1"
    );
    for (name, unit) in UNITS {
        let r: Vec<f64> = [1, 8, 16]
            .iter()
            .map(|&t| rate(&dev, &mlp, *unit, t, Duration::from_millis(500)))
            .collect::<Result<_>>()?;
        println!(
            "{name:<44} {:>10.0} {:>10.0} {:>10.0} {:>7.2}x",
            r[0],
            r[1],
            r[2],
            r[1] / r[0]
        );
    }
    Ok(())
}
