//! Where a small-MLP forward's time goes on CUDA, and which parts scale with threads.
//!
//! Two tables. `units`: each row runs one unit of work in a loop on every thread (each thread
//! on its own pooled stream) and reports operations per second at 1, 8, 16 and 64 threads.
//! `phases`: the bench's call (upload one row, MLP forward, read back) with a host timer
//! around each phase, eager and through a [`GraphCache`], at 1 to 64 threads: calls/s, p50
//! and p99 call latency, and the mean host time of each phase (the read-back includes the
//! wait for the GPU; mode `host` is `GraphCache::run_host`, the whole call in "forward").
//! `PROFILE_MODES=eager,graph,host` picks modes. Run on a GPU machine:
//! `cargo run --release --features cuda --example cuda_profile [units] [phases]` (both when
//! no argument is given). The environment switches compared: `STREAMPOOL_CUDA_H2D`
//! (`staged`/`pageable`), `STREAMPOOL_CUDA_WAIT` (`spin`/`blocking`/`yield`).

use std::time::{Duration, Instant};

use streampool::{Activation, Device, GraphCache, Result, Tensor};

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

/// Host time of each phase of one thread's calls, in nanoseconds.
#[derive(Default)]
struct Phases {
    calls: u64,
    upload: u64,
    forward: u64,
    read_back: u64,
    latencies: Vec<u32>,
}

#[derive(Clone, Copy)]
enum Mode<'a> {
    Eager,
    /// `GraphCache::run` between `from_vec` and `to_vec`.
    Graph(&'a GraphCache),
    /// `GraphCache::run_host`: the whole call (counted as "forward").
    Host(&'a GraphCache),
}

fn phases(
    dev: &Device,
    mlp: &Mlp,
    mode: Mode<'_>,
    threads: usize,
    window: Duration,
) -> Result<(f64, Phases)> {
    let start = Instant::now() + Duration::from_millis(150);
    let end = start + window;
    let per_thread = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || -> Result<Phases> {
                    let mut p = Phases::default();
                    let mut i = 0usize;
                    loop {
                        let t0 = Instant::now();
                        if t0 >= end {
                            return Ok(p);
                        }
                        let row: Vec<f32> = (0..256)
                            .map(|k| ((t * 31 + i * 7 + k) % 17) as f32 * 0.1)
                            .collect();
                        i += 1;
                        let (t1, t2) = if let Mode::Host(g) = mode {
                            let t1 = Instant::now();
                            g.run_host("mlp", dev, &[(&row[..], &[1, 256][..])], |i| {
                                Ok::<_, streampool::Error>(vec![mlp.forward(&i[0])?])
                            })?;
                            (t1, Instant::now())
                        } else {
                            let x = Tensor::from_vec(row, &[1, 256], dev)?;
                            let t1 = Instant::now();
                            let y = match mode {
                                Mode::Graph(g) => g
                                    .run("mlp", &[&x], |i| {
                                        Ok::<_, streampool::Error>(vec![mlp.forward(&i[0])?])
                                    })?
                                    .remove(0),
                                _ => mlp.forward(&x)?,
                            };
                            let t2 = Instant::now();
                            y.to_vec::<f32>()?;
                            (t1, t2)
                        };
                        let t3 = Instant::now();
                        if t0 >= start {
                            p.calls += 1;
                            p.upload += (t1 - t0).as_nanos() as u64;
                            p.forward += (t2 - t1).as_nanos() as u64;
                            p.read_back += (t3 - t2).as_nanos() as u64;
                            p.latencies
                                .push((t3 - t0).as_nanos().min(u32::MAX as u128) as u32);
                        }
                    }
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("profile thread"))
            .collect::<Result<Vec<Phases>>>()
    })?;
    let mut all = Phases::default();
    for p in per_thread {
        all.calls += p.calls;
        all.upload += p.upload;
        all.forward += p.forward;
        all.read_back += p.read_back;
        all.latencies.extend(p.latencies);
    }
    all.latencies.sort_unstable();
    Ok((all.calls as f64 / window.as_secs_f64(), all))
}

fn print_phases(dev: &Device, mlp: &Mlp) -> Result<()> {
    println!(
        "\nphases of the bench's call (upload [1,256] + MLP forward + read back), host time per call"
    );
    println!(
        "{:<7} {:>7} {:>10} {:>8} {:>8} {:>10} {:>10} {:>10}",
        "mode", "threads", "calls/s", "p50 us", "p99 us", "upload us", "forward us", "readback us"
    );
    let (graphs, host) = (GraphCache::new(256), GraphCache::new(256));
    let modes = [
        ("eager", Mode::Eager),
        ("graph", Mode::Graph(&graphs)),
        ("host", Mode::Host(&host)),
    ];
    let only: Option<String> = std::env::var("PROFILE_MODES").ok();
    for (name, m) in modes {
        if only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|x| x == name))
        {
            continue;
        }
        let mode = name;
        for threads in [1, 2, 4, 8, 16, 32, 64] {
            let (rate, p) = phases(dev, mlp, m, threads, Duration::from_millis(700))?;
            let n = p.calls.max(1) as f64;
            let pct = |q: f64| {
                p.latencies
                    .get(((p.latencies.len() as f64 - 1.0) * q) as usize)
                    .map_or(0.0, |&v| v as f64 / 1e3)
            };
            println!(
                "{mode:<7} {threads:>7} {rate:>10.0} {:>8.1} {:>8.1} {:>10.2} {:>10.2} {:>10.2}",
                pct(0.5),
                pct(0.99),
                p.upload as f64 / n / 1e3,
                p.forward as f64 / n / 1e3,
                p.read_back as f64 / n / 1e3,
            );
        }
    }
    println!(
        "graph caches: {:?} (graph), {:?} (host)",
        graphs.stats(),
        host.stats()
    );
    Ok(())
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
    // What the runtime took from the environment, as it reads it.
    let cuda = &streampool::config::tuning().cuda;
    println!(
        "cuda_profile on {} (staging {}, h2d {:?}, wait {:?})",
        dev.name(),
        cuda.staging,
        cuda.h2d,
        cuda.wait,
    );
    let args: Vec<String> = std::env::args().skip(1).collect();
    let want = |what: &str| args.is_empty() || args.iter().any(|a| a == what);
    if want("units") {
        println!(
            "{:<44} {:>10} {:>10} {:>10} {:>10} {:>8}",
            "unit (ops/s)", "1 thread", "8", "16", "64", "8 / 1"
        );
        for (name, unit) in UNITS {
            let r: Vec<f64> = [1, 8, 16, 64]
                .iter()
                .map(|&t| rate(&dev, &mlp, *unit, t, Duration::from_millis(400)))
                .collect::<Result<_>>()?;
            println!(
                "{name:<44} {:>10.0} {:>10.0} {:>10.0} {:>10.0} {:>7.2}x",
                r[0],
                r[1],
                r[2],
                r[3],
                r[1] / r[0]
            );
        }
    }
    if want("phases") {
        print_phases(&dev, &mlp)?;
    }
    Ok(())
}
