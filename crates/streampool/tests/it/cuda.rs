//! The GPU suite: every op against the CPU backend, and the concurrency tests on CUDA streams.
//!
//! Every test first opens `cuda:0` and returns early (printing "no CUDA device, skipping")
//! where there is none, so the suite passes cleanly on machines without a GPU.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use streampool::{Activation, Device, DeviceConfig, Error, Event, StreamGuard, Tensor};

use crate::util::rel_err_vs_mean;

fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("no CUDA device, skipping ({e})");
            None
        }
    }
}

/// Runs `f` on both devices (inputs made by `make` on each) and checks rel err < 1e-4.
fn check(
    name: &str,
    gpu: &Device,
    make: impl Fn(&Device) -> Vec<Tensor>,
    f: impl Fn(&[Tensor]) -> streampool::Result<Tensor>,
) {
    let cpu = Device::cpu();
    let want_t = f(&make(&cpu)).unwrap_or_else(|e| panic!("{name} on cpu: {e}"));
    let got_t = f(&make(gpu)).unwrap_or_else(|e| panic!("{name} on gpu: {e}"));
    assert_eq!(got_t.dims(), want_t.dims(), "{name}: shapes differ");
    let (got, want) = (
        got_t.to_vec::<f32>().unwrap(),
        want_t.to_vec::<f32>().unwrap(),
    );
    let err = rel_err_vs_mean(&got, &want);
    assert!(err < 1e-4, "{name}: relative error {err:e} >= 1e-4");
}

type UnaryFn = fn(&Tensor) -> streampool::Result<Tensor>;
type BinaryFn = fn(&Tensor, &Tensor) -> streampool::Result<Tensor>;

fn randn(shape: &[usize], seed: u64, dev: &Device) -> Tensor {
    Tensor::randn(shape, seed, dev).unwrap()
}

#[test]
fn matmul_matches_cpu_in_every_layout() {
    let Some(g) = gpu() else { return };
    check(
        "matmul 2d",
        &g,
        |d| vec![randn(&[33, 70], 1, d), randn(&[70, 45], 2, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul 256x1024",
        &g,
        |d| vec![randn(&[32, 256], 3, d), randn(&[256, 1024], 4, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul batched",
        &g,
        |d| vec![randn(&[3, 17, 20], 5, d), randn(&[3, 20, 9], 6, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul 4d batched",
        &g,
        |d| vec![randn(&[2, 3, 5, 8], 7, d), randn(&[2, 3, 8, 4], 8, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul shared rhs",
        &g,
        |d| vec![randn(&[4, 5, 16], 9, d), randn(&[16, 8], 10, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul transposed lhs",
        &g,
        |d| vec![randn(&[20, 13], 11, d), randn(&[20, 7], 12, d)],
        |t| t[0].t()?.matmul(&t[1]),
    );
    check(
        "matmul transposed rhs",
        &g,
        |d| vec![randn(&[6, 20], 13, d), randn(&[11, 20], 14, d)],
        |t| t[0].matmul(&t[1].t()?),
    );
    check(
        "matmul both transposed, batched",
        &g,
        |d| vec![randn(&[3, 9, 5], 15, d), randn(&[3, 6, 9], 16, d)],
        |t| t[0].t()?.matmul(&t[1].t()?),
    );
    check(
        "matmul narrowed rows",
        &g,
        |d| vec![randn(&[10, 12], 17, d), randn(&[12, 5], 18, d)],
        |t| t[0].narrow(0, 3, 4)?.matmul(&t[1]),
    );
    check(
        "matmul narrowed cols",
        &g,
        |d| vec![randn(&[10, 12], 19, d), randn(&[8, 9], 20, d)],
        |t| t[0].narrow(1, 2, 8)?.matmul(&t[1]),
    );
    check(
        "matmul vector shapes",
        &g,
        |d| vec![randn(&[1, 64], 21, d), randn(&[64, 1], 22, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul k = 1",
        &g,
        |d| vec![randn(&[7, 1], 23, d), randn(&[1, 5], 24, d)],
        |t| t[0].matmul(&t[1]),
    );
    check(
        "matmul k = 0",
        &g,
        |d| {
            vec![
                Tensor::zeros(&[3, 0], d).unwrap(),
                Tensor::zeros(&[0, 4], d).unwrap(),
            ]
        },
        |t| t[0].matmul(&t[1]),
    );
}

#[test]
fn elementwise_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let unary: &[(&str, UnaryFn)] = &[
        ("relu", |t| t.relu()),
        ("gelu", |t| t.gelu()),
        ("tanh", |t| t.tanh()),
        ("exp", |t| t.exp()),
        ("sqr", |t| t.sqr()),
        ("neg", |t| t.neg()),
        ("affine", |t| t.affine(1.5, -0.25)),
    ];
    for (name, f) in unary {
        check(name, &g, |d| vec![randn(&[37, 91], 30, d)], |t| f(&t[0]));
        check(
            &format!("{name} non-contiguous"),
            &g,
            |d| vec![randn(&[37, 91], 31, d)],
            |t| f(&t[0].t()?),
        );
    }
    let positive = |d: &Device| vec![Tensor::rand_uniform(&[1000], 0.5, 4.0, 32, d).unwrap()];
    check("sqrt", &g, positive, |t| t[0].sqrt());
    check("recip", &g, positive, |t| t[0].recip());
    check(
        "fill",
        &g,
        |d| vec![Tensor::full(2.5, &[3, 1000], d).unwrap()],
        |t| Ok(t[0].clone()),
    );

    let binary: &[(&str, BinaryFn)] = &[
        ("add", |a, b| a.add(b)),
        ("sub", |a, b| a.sub(b)),
        ("mul", |a, b| a.mul(b)),
        ("maximum", |a, b| a.maximum(b)),
    ];
    for (name, f) in binary {
        check(
            name,
            &g,
            |d| vec![randn(&[8, 300], 33, d), randn(&[8, 300], 34, d)],
            |t| f(&t[0], &t[1]),
        );
        check(
            &format!("{name} broadcast"),
            &g,
            |d| vec![randn(&[4, 1, 6], 35, d), randn(&[5, 6], 36, d)],
            |t| f(&t[0], &t[1]),
        );
        check(
            &format!("{name} scalar"),
            &g,
            |d| vec![randn(&[3, 7], 37, d), randn(&[1], 38, d)],
            |t| f(&t[0], &t[1]),
        );
        check(
            &format!("{name} transposed"),
            &g,
            |d| vec![randn(&[9, 14], 39, d), randn(&[14, 9], 40, d)],
            |t| f(&t[0].t()?, &t[1]),
        );
        check(
            &format!("{name} narrowed 3d"),
            &g,
            |d| vec![randn(&[4, 6, 10], 41, d), randn(&[6, 3], 42, d)],
            |t| f(&t[0].narrow(2, 5, 3)?, &t[1]),
        );
    }
    check(
        "div",
        &g,
        |d| {
            vec![
                randn(&[500], 43, d),
                Tensor::rand_uniform(&[500], 0.5, 2.0, 44, d).unwrap(),
            ]
        },
        |t| t[0].div(&t[1]),
    );
    check(
        "div broadcast",
        &g,
        |d| {
            vec![
                randn(&[6, 50], 45, d),
                Tensor::rand_uniform(&[6, 1], 0.5, 2.0, 46, d).unwrap(),
            ]
        },
        |t| t[0].div(&t[1]),
    );
}

#[test]
fn row_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    for cols in [1, 7, 32, 300, 1024, 3000] {
        check(
            &format!("softmax cols={cols}"),
            &g,
            |d| vec![randn(&[5, cols], 50, d).scale(3.0).unwrap()],
            |t| t[0].softmax(),
        );
        let ln = |d: &Device| {
            vec![
                randn(&[6, cols], 51, d),
                randn(&[cols], 52, d),
                randn(&[cols], 53, d),
                randn(&[6, cols], 54, d),
            ]
        };
        check(&format!("layer_norm cols={cols}"), &g, ln, |t| {
            t[0].layer_norm(&t[1], &t[2], 1e-5)
        });
        check(&format!("add_layer_norm cols={cols}"), &g, ln, |t| {
            t[0].add_layer_norm(&t[3], &t[1], &t[2], 1e-12)
        });
    }
    check(
        "softmax non-contiguous",
        &g,
        |d| vec![randn(&[40, 30], 55, d)],
        |t| t[0].t()?.softmax(),
    );
    check(
        "softmax 3d",
        &g,
        |d| vec![randn(&[2, 12, 64], 56, d)],
        |t| t[0].softmax(),
    );
    for act in [Activation::Identity, Activation::Relu, Activation::Gelu] {
        check(
            &format!("bias_act {act:?}"),
            &g,
            |d| vec![randn(&[32, 1024], 57, d), randn(&[1024], 58, d)],
            |t| t[0].bias_act(&t[1], act),
        );
        check(
            &format!("bias_act {act:?} 3d transposed"),
            &g,
            |d| vec![randn(&[3, 8, 5], 59, d), randn(&[8], 60, d)],
            |t| t[0].transpose(1, 2)?.bias_act(&t[1], act),
        );
    }
}

#[test]
fn gather_copy_and_reductions_match_cpu() {
    let Some(g) = gpu() else { return };
    // Embedding gather, with out-of-range ids giving zero rows in `index_select`.
    check(
        "embedding",
        &g,
        |d| vec![randn(&[50, 33], 70, d)],
        |t| t[0].embedding(&[3, 0, 49, 3, 17, 22], &[2, 3]),
    );
    check(
        "index_select out of range",
        &g,
        |d| {
            vec![
                randn(&[10, 8], 71, d),
                Tensor::from_vec(vec![1i64, -1, 10, 9], &[4], d).unwrap(),
            ]
        },
        |t| t[0].index_select(&t[1]),
    );
    // Transposes and narrows made contiguous.
    check(
        "contiguous transpose(0,2)",
        &g,
        |d| vec![randn(&[3, 4, 5], 72, d)],
        |t| t[0].transpose(0, 2)?.contiguous(),
    );
    check(
        "contiguous narrow",
        &g,
        |d| vec![randn(&[6, 7, 8], 73, d)],
        |t| t[0].narrow(1, 2, 3)?.narrow(2, 1, 5)?.contiguous(),
    );
    check(
        "reshape of a view",
        &g,
        |d| vec![randn(&[4, 6], 74, d)],
        |t| t[0].t()?.reshape(&[3, 8]),
    );
    check(
        "contiguous rank 9",
        &g,
        |d| vec![randn(&[2, 1, 2, 3, 1, 2, 2, 3, 2], 75, d)],
        |t| t[0].transpose(0, 8)?.transpose(2, 6)?.contiguous(),
    );
    for axis in 0..3 {
        for keep in [false, true] {
            let x = |d: &Device| vec![randn(&[4, 130, 3], 76, d)];
            check(&format!("sum axis {axis}"), &g, x, |t| t[0].sum(axis, keep));
            check(&format!("mean axis {axis}"), &g, x, |t| {
                t[0].mean(axis, keep)
            });
            check(&format!("max axis {axis}"), &g, x, |t| t[0].max(axis, keep));
        }
    }
    for cols in [3, 64, 1000] {
        let x = |d: &Device| vec![randn(&[7, cols], 77, d)];
        check(&format!("sum rows {cols}"), &g, x, |t| t[0].sum(1, false));
        check(&format!("mean rows {cols}"), &g, x, |t| t[0].mean(1, true));
        check(&format!("max rows {cols}"), &g, x, |t| t[0].max(1, false));
    }
    check(
        "sum of a transposed view",
        &g,
        |d| vec![randn(&[20, 90], 78, d)],
        |t| t[0].t()?.sum(1, false),
    );
}

#[test]
fn every_dtype_round_trips_and_copies() {
    let Some(g) = gpu() else { return };
    let ids: Vec<i64> = (0..60).map(|i| i * 7 - 100).collect();
    let t = Tensor::from_vec(ids.clone(), &[3, 4, 5], &g).unwrap();
    assert_eq!(t.to_vec::<i64>().unwrap(), ids);
    let cpu_t = Tensor::from_vec(ids, &[3, 4, 5], &Device::cpu()).unwrap();
    let want = cpu_t
        .transpose(0, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<i64>()
        .unwrap();
    assert_eq!(t.transpose(0, 2).unwrap().to_vec::<i64>().unwrap(), want);

    let halves: Vec<half::f16> = (0..24)
        .map(|i| half::f16::from_f32(i as f32 * 0.5))
        .collect();
    let h = Tensor::from_vec(halves.clone(), &[4, 6], &g).unwrap();
    let want: Vec<half::f16> = (0..24).map(|i| halves[(i % 4) * 6 + i / 4]).collect();
    assert_eq!(h.t().unwrap().to_vec::<half::f16>().unwrap(), want);
    let b: Vec<half::bf16> = (0..10).map(|i| half::bf16::from_f32(i as f32)).collect();
    let bt = Tensor::from_vec(b.clone(), &[10], &g).unwrap();
    assert_eq!(
        bt.to_device(&Device::cpu())
            .unwrap()
            .to_vec::<half::bf16>()
            .unwrap(),
        b
    );

    // CPU -> GPU -> CPU keeps every value.
    let x = randn(&[17, 19], 80, &Device::cpu());
    let back = x.to_device(&g).unwrap().to_device(&Device::cpu()).unwrap();
    assert_eq!(back.to_vec::<f32>().unwrap(), x.to_vec::<f32>().unwrap());
    // Copies too large for the pinned staging buffers take the pageable path.
    let big = randn(&[1024, 1100], 81, &Device::cpu());
    let big_back = big.to_device(&g).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(big_back, big.to_vec::<f32>().unwrap());
    // Empty tensors.
    let e = Tensor::zeros(&[0, 5], &g).unwrap();
    assert!(e.to_vec::<f32>().unwrap().is_empty());
    assert!(e.relu().unwrap().to_vec::<f32>().unwrap().is_empty());
}

struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    fn new(d: &Device) -> Mlp {
        Mlp {
            w1: randn(&[64, 256], 90, d).scale(0.125).unwrap(),
            b1: randn(&[256], 91, d),
            w2: randn(&[256, 64], 92, d).scale(0.0625).unwrap(),
            b2: randn(&[64], 93, d),
        }
    }
    fn forward(&self, x: &Tensor) -> Tensor {
        let h = x
            .matmul(&self.w1)
            .unwrap()
            .bias_act(&self.b1, Activation::Gelu)
            .unwrap();
        let y = h
            .matmul(&self.w2)
            .unwrap()
            .bias_act(&self.b2, Activation::Identity)
            .unwrap();
        y.softmax().unwrap()
    }
}

/// `threads` threads each run `iters` forwards of the shared model on their own input and
/// compare each result with the CPU backend's.
fn concurrent_forwards(g: &Device, threads: usize, iters: usize) {
    let cpu = Device::cpu();
    let (mg, mc) = (Arc::new(Mlp::new(g)), Mlp::new(&cpu));
    let want: Vec<Vec<f32>> = (0..threads)
        .map(|i| {
            mc.forward(&randn(&[1 + i % 8, 64], 100 + i as u64, &cpu))
                .to_vec()
                .unwrap()
        })
        .collect();
    let want = Arc::new(want);
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|i| {
            let (mg, want, barrier) = (mg.clone(), want.clone(), barrier.clone());
            std::thread::spawn(move || {
                let g = Device::cuda(0).unwrap();
                let x = randn(&[1 + i % 8, 64], 100 + i as u64, &g);
                barrier.wait();
                for it in 0..iters {
                    let got = mg.forward(&x).to_vec::<f32>().unwrap();
                    let err = rel_err_vs_mean(&got, &want[i]);
                    assert!(
                        err < 1e-4,
                        "thread {i} iteration {it}: relative error {err:e}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("worker thread");
    }
    g.synchronize().unwrap();
}

#[test]
fn concurrent_forwards_match_cpu_from_2_4_8_and_64_threads() {
    let Some(g) = gpu() else { return };
    for threads in [2, 4, 8, 64] {
        concurrent_forwards(&g, threads, 40);
    }
    // 64 threads over 31 pooled streams: streams (and their cuBLAS handles) were shared.
    assert!(g.streams_created() <= g.pool_size());
}

#[test]
fn thread_churn_and_tensors_moving_between_threads() {
    let Some(g) = gpu() else { return };
    let cpu = Device::cpu();
    let w = Arc::new(randn(&[32, 32], 110, &g));
    let want = randn(&[4, 32], 111, &cpu)
        .matmul(&randn(&[32, 32], 110, &cpu))
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for round in 0..10 {
        let handles: Vec<_> = (0..20)
            .map(|_| {
                let w = w.clone();
                std::thread::spawn(move || {
                    let g = Device::cuda(0).unwrap();
                    // Made here, returned to and read on another thread.
                    randn(&[4, 32], 111, &g).matmul(&w).unwrap()
                })
            })
            .collect();
        for h in handles {
            let t = h.join().expect("churn thread");
            assert!(
                rel_err_vs_mean(&t.to_vec::<f32>().unwrap(), &want) < 1e-4,
                "round {round}"
            );
        }
    }
}

#[test]
fn consumer_waits_for_a_slow_producer_stream() {
    let Some(g) = gpu() else { return };
    let (producer, consumer) = (g.stream_from_pool().unwrap(), g.stream_from_pool().unwrap());
    assert_ne!(producer, consumer);
    let x = randn(&[256, 256], 120, &g);
    let want: Vec<f32> = x
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v * 2.0 + 1.0)
        .collect();
    for _ in 0..5 {
        let y = {
            let _s = StreamGuard::new(&producer);
            producer.debug_delay(Duration::from_millis(50)).unwrap();
            x.scale(2.0).unwrap()
        };
        let _s = StreamGuard::new(&consumer);
        let z = y.affine(1.0, 1.0).unwrap();
        assert_eq!(z.to_vec::<f32>().unwrap(), want);
    }
}

#[test]
fn freed_memory_is_not_reused_under_a_slow_stream() {
    let Some(_g) = gpu() else { return };
    // A separate device, so the checks see only this test's blocks. The limit holds exactly
    // two blocks of the size used (and some small ones), which forces reuse of the block still in use.
    let shape = [1024, 256];
    let bytes = 1024 * 256 * 4;
    let limit = 2 * bytes + (64 << 10);
    let dev = Device::cuda_with(
        0,
        DeviceConfig {
            memory_limit: Some(limit),
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let (slow, fast) = (
        dev.stream_from_pool().unwrap(),
        dev.stream_from_pool().unwrap(),
    );
    let ones = {
        let _s = StreamGuard::new(&fast);
        Tensor::ones(&shape, &dev).unwrap()
    };
    for round in 0..5 {
        let read_back = {
            let _s = StreamGuard::new(&slow);
            slow.debug_delay(Duration::from_millis(100)).unwrap();
            // Written after the delay, into a fresh block, then freed while still pending.
            let t = ones.scale(3.0).unwrap();
            let r = t.sum(1, false).unwrap();
            drop(t);
            r
        };
        let _s = StreamGuard::new(&fast);
        // The limit is reached: this must not scribble over `t`'s block before the slow
        // stream is done with it (or must wait for it on the device).
        let f = Tensor::full(-5.0, &shape, &dev).unwrap();
        let fv = f.to_vec::<f32>().unwrap();
        assert!(
            fv.iter().all(|&v| v == -5.0),
            "round {round}: new tensor corrupted"
        );
        let rv = read_back.to_vec::<f32>().unwrap();
        assert!(
            rv.iter().all(|&v| v == 768.0),
            "round {round}: slow stream read reused memory"
        );
    }
    dev.synchronize().unwrap();
    let s = dev.allocator_stats();
    eprintln!("allocator after slow-stream reuse: {s:?}");
    assert!(s.reserved <= limit);
}

#[test]
fn out_of_memory_is_an_error_and_the_device_keeps_working() {
    let Some(g) = gpu() else { return };
    let limited = Device::cuda_with(
        0,
        DeviceConfig {
            memory_limit: Some(1 << 20),
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    match Tensor::zeros(&[1 << 20], &limited) {
        Err(Error::OutOfMemory {
            requested, limit, ..
        }) => {
            assert_eq!(requested, 4 << 20);
            assert_eq!(limit, Some(1 << 20));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let small = Tensor::ones(&[1000], &limited)
        .unwrap()
        .sum(0, false)
        .unwrap();
    assert_eq!(small.to_scalar().unwrap(), 1000.0);

    // More than the GPU has: the driver's out-of-memory, reported the same way.
    match Tensor::zeros(&[1usize << 40], &g) {
        Err(Error::OutOfMemory { .. }) => {}
        other => panic!("expected OutOfMemory from the driver, got {other:?}"),
    }
    let x = randn(&[8, 8], 130, &g);
    assert_eq!(x.relu().unwrap().to_vec::<f32>().unwrap().len(), 64);
}

#[test]
fn events_time_and_order_streams() {
    let Some(g) = gpu() else { return };
    let s = g.stream_from_pool().unwrap();
    let start = Event::record(&s).unwrap();
    s.debug_delay(Duration::from_millis(20)).unwrap();
    let end = Event::record(&s).unwrap();
    end.synchronize().unwrap();
    assert!(end.query() && start.query());
    let dt = end.elapsed_since(&start).unwrap();
    // The sleep kernel spins for at least the asked time of the GPU's global timer.
    assert!(dt >= Duration::from_millis(19), "elapsed {dt:?}");

    // An event orders another stream: its copy sees the producer's result.
    let other = g.stream_from_pool().unwrap();
    let x = randn(&[64], 131, &g);
    let y = {
        let _s = StreamGuard::new(&s);
        s.debug_delay(Duration::from_millis(30)).unwrap();
        x.neg().unwrap()
    };
    let e = Event::record(&s).unwrap();
    other.wait_event(&e).unwrap();
    let _o = StreamGuard::new(&other);
    let want: Vec<f32> = x.to_vec::<f32>().unwrap().iter().map(|v| -v).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
    // Device-wide synchronize covers every stream.
    s.debug_delay(Duration::from_millis(10)).unwrap();
    let pending = Event::record(&s).unwrap();
    g.synchronize().unwrap();
    assert!(pending.query());
}

#[test]
fn errors_are_isolated_and_streams_are_lazy() {
    let Some(_g) = gpu() else { return };
    let dev = Device::cuda_with(0, DeviceConfig::default()).unwrap();
    assert_eq!(dev.streams_created(), 0, "streams are created on first use");
    let a = randn(&[3, 4], 140, &dev);
    let b = randn(&[5, 6], 141, &dev);
    assert!(matches!(a.matmul(&b), Err(Error::Shape { .. })));
    assert!(matches!(a.add(&b), Err(Error::Shape { .. })));
    let cpu_t = randn(&[4, 3], 142, &Device::cpu());
    assert!(matches!(a.matmul(&cpu_t), Err(Error::Device { .. })));
    // The device still works after the errors.
    let c = a.matmul(&randn(&[4, 2], 143, &dev)).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap().len(), 6);
    assert_eq!(dev.streams_created(), 1);
}

/// NVRTC compiles, module loads, cuBLAS handle creation and destruction, and gemms, from many
/// threads at once: each thread opens its own device (own kernel cache, own streams and
/// handles) at the same moment, checks results against the CPU, and drops it. This is the
/// test that would show a vendor call needing a quarantine lock.
#[test]
fn vendor_calls_from_many_threads_at_once() {
    let Some(_g) = gpu() else { return };
    let cpu = Device::cpu();
    let want = randn(&[16, 48], 150, &cpu)
        .matmul(&randn(&[48, 40], 151, &cpu))
        .unwrap()
        .gelu()
        .unwrap()
        .softmax()
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let want = Arc::new(want);
    for round in 0..3 {
        let barrier = Arc::new(Barrier::new(8));
        let handles: Vec<_> = (0..8)
            .map(|i| {
                let (barrier, want) = (barrier.clone(), want.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    let dev = Device::cuda_with(0, DeviceConfig::default()).unwrap();
                    let (a, b) = (randn(&[16, 48], 150, &dev), randn(&[48, 40], 151, &dev));
                    // Several streams of the new device, each with its own handle.
                    for _ in 0..3 {
                        let s = dev.stream_from_pool().unwrap();
                        let _guard = StreamGuard::new(&s);
                        let got = a
                            .matmul(&b)
                            .unwrap()
                            .gelu()
                            .unwrap()
                            .softmax()
                            .unwrap()
                            .to_vec::<f32>()
                            .unwrap();
                        let err = rel_err_vs_mean(&got, &want);
                        assert!(
                            err < 1e-4,
                            "round {round} thread {i}: relative error {err:e}"
                        );
                    }
                    dev.synchronize().unwrap();
                })
            })
            .collect();
        for h in handles {
            h.join().expect("vendor stress thread");
        }
    }
    // And on the shared device: many threads, many shapes, all streams' handles busy at once.
    let g = Device::cuda(0).unwrap();
    let handles: Vec<_> = (0..32)
        .map(|i| {
            std::thread::spawn(move || {
                let g = Device::cuda(0).unwrap();
                let cpu = Device::cpu();
                for j in 0..20 {
                    let (m, k, n) = (
                        1 + (i * 7 + j) % 50,
                        1 + (i + j * 3) % 70,
                        1 + (i * 5 + j) % 40,
                    );
                    let seed = (i * 100 + j) as u64;
                    let got = randn(&[m, k], seed, &g)
                        .matmul(&randn(&[k, n], seed + 1, &g))
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let want = randn(&[m, k], seed, &cpu)
                        .matmul(&randn(&[k, n], seed + 1, &cpu))
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    assert!(
                        rel_err_vs_mean(&got, &want) < 1e-4,
                        "thread {i} gemm {m}x{k}x{n}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("gemm stress thread");
    }
    g.synchronize().unwrap();
}

/// Every op the models use, in F16 and BF16 (and TF32 for the matmul), on the GPU against the
/// CPU backend (itself checked against float64 in `dtypes`) on identical rounded
/// inputs: norm-relative error at most 2e-3 (F16) and 2e-2 (BF16), i.e. both within the
/// storage rounding of the float64 reference.
#[test]
fn half_ops_match_the_cpu_backend() {
    use streampool::MatmulMath;
    let Some(g) = gpu() else { return };
    let (b, s, nh, d) = (3, 77, 12, 32);
    let h = nh * d;
    let shapes: Vec<HalfCase> = vec![
        (
            "matmul",
            vec![vec![b * s, h], vec![h, 4 * h]],
            Box::new(|t| t[0].matmul(&t[1])),
        ),
        (
            "matmul tf32",
            vec![vec![b * s, h], vec![h, 4 * h]],
            Box::new(|t| t[0].matmul_with(&t[1], MatmulMath::Tf32)),
        ),
        (
            "matmul + bias (cuBLASLt epilogue)",
            vec![vec![b, s, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| t[0].matmul_bias(&t[1], &t[2], MatmulMath::Exact)),
        ),
        (
            // k = 4n: the residual through cuBLASLt's C in f16/bf16 (timed at 1024 rows); f32
            // adds it separately.
            "matmul + bias + residual, 1024 rows",
            vec![vec![1024, 4 * h], vec![4 * h, h], vec![h], vec![1024, h]],
            Box::new(|t| t[0].matmul_bias_residual(&t[1], &t[2], &t[3], MatmulMath::Exact)),
        ),
        (
            "matmul + bias + residual, [b, s, 4h] (the residual reshaped with the rows)",
            vec![vec![b, s, 4 * h], vec![4 * h, h], vec![h], vec![b, s, h]],
            Box::new(|t| t[0].matmul_bias_residual(&t[1], &t[2], &t[3], MatmulMath::Exact)),
        ),
        (
            "matmul + bias, 1024 rows (cuBLASLt algorithms timed)",
            vec![vec![1024, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| t[0].matmul_bias(&t[1], &t[2], MatmulMath::Exact)),
        ),
        (
            "matmul + bias, 1000 rows (the 1024 bucket's timed choice)",
            vec![vec![1000, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| t[0].matmul_bias(&t[1], &t[2], MatmulMath::Exact)),
        ),
        (
            "matmul^T + bias, odd width",
            vec![vec![b * s, h], vec![37, h], vec![37]],
            Box::new(|t| t[0].matmul_bias(&t[1].t()?, &t[2], MatmulMath::Exact)),
        ),
        (
            "matmul + bias + tanh GELU (cuBLASLt GELU_BIAS)",
            vec![vec![b, s, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| {
                t[0].matmul_bias_act(&t[1], &t[2], Activation::GeluTanh, MatmulMath::Exact)
            }),
        ),
        (
            "matmul + bias + relu (cuBLASLt RELU_BIAS)",
            vec![vec![b * s, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| t[0].matmul_bias_act(&t[1], &t[2], Activation::Relu, MatmulMath::Exact)),
        ),
        (
            "matmul + bias + erf GELU (no epilogue: separate pass)",
            vec![vec![b * s, h], vec![h, 4 * h], vec![4 * h]],
            Box::new(|t| t[0].matmul_bias_act(&t[1], &t[2], Activation::Gelu, MatmulMath::Exact)),
        ),
        (
            "bias tanh gelu",
            vec![vec![b * s, h], vec![h]],
            Box::new(|t| t[0].bias_act(&t[1], Activation::GeluTanh)),
        ),
        (
            "batched matmul t",
            vec![vec![b, s, d], vec![b, s, d]],
            Box::new(|t| t[0].matmul(&t[1].t()?)),
        ),
        (
            "bias gelu",
            vec![vec![b * s, h], vec![h]],
            Box::new(|t| t[0].bias_act(&t[1], Activation::Gelu)),
        ),
        (
            "bias gelu, odd width (scalar kernel)",
            vec![vec![b * s, 37], vec![37]],
            Box::new(|t| t[0].bias_act(&t[1], Activation::Gelu)),
        ),
        (
            "add broadcast",
            vec![vec![b, s, h], vec![s, h]],
            Box::new(|t| t[0].add(&t[1])),
        ),
        (
            "add_layer_norm",
            vec![vec![b * s, h], vec![b * s, h], vec![h], vec![h]],
            Box::new(|t| t[0].add_layer_norm(&t[1], &t[2], &t[3], 1e-12)),
        ),
        (
            "layer_norm, no residual (half-warp rows, 3 steps)",
            vec![vec![b * s, h], vec![h], vec![h]],
            Box::new(|t| t[0].layer_norm(&t[1], &t[2], 1e-5)),
        ),
        (
            "add_layer_norm 520 (half-warp rows, a partial 5th step)",
            vec![vec![b * s, 520], vec![b * s, 520], vec![520], vec![520]],
            Box::new(|t| t[0].add_layer_norm(&t[1], &t[2], &t[3], 1e-5)),
        ),
        (
            "add_layer_norm 100 (warp row: not a multiple of 8)",
            vec![vec![b * s, 100], vec![b * s, 100], vec![100], vec![100]],
            Box::new(|t| t[0].add_layer_norm(&t[1], &t[2], &t[3], 1e-5)),
        ),
        (
            "add_layer_norm 1024 (widest half-warp row)",
            vec![vec![b * s, 1024], vec![b * s, 1024], vec![1024], vec![1024]],
            Box::new(|t| t[0].add_layer_norm(&t[1], &t[2], &t[3], 1e-5)),
        ),
        (
            "add_layer_norm 1030 (block row)",
            vec![vec![b * s, 1030], vec![b * s, 1030], vec![1030], vec![1030]],
            Box::new(|t| t[0].add_layer_norm(&t[1], &t[2], &t[3], 1e-5)),
        ),
        (
            "softmax",
            vec![vec![b * s, s]],
            Box::new(|t| t[0].softmax()),
        ),
        ("sum", vec![vec![b, s, h]], Box::new(|t| t[0].sum(1, false))),
        (
            "max",
            vec![vec![b * s, h]],
            Box::new(|t| t[0].max(1, false)),
        ),
        (
            "attention",
            vec![vec![b, s, 3 * h]],
            Box::new(move |t| {
                let mask: Vec<f32> = (0..b * s)
                    .map(|i| (i % s < s - 20 * (i / s)) as u8 as f32)
                    .collect();
                t[0].attention(Some(&Tensor::from_vec(mask, &[b, s], t[0].device())?), nh)
            }),
        ),
        (
            "embedding rows of 16-byte chunks",
            vec![vec![50, h]],
            Box::new(|t| t[0].embedding(&[3, 0, 49, 3, 17, 22], &[2, 3])),
        ),
        (
            "attention d=64 no mask",
            vec![vec![2, 300, 3 * 128]],
            Box::new(|t| t[0].attention(None, 2)),
        ),
        (
            "attention d=128, 2 tiles",
            vec![vec![2, 130, 3 * 256]],
            Box::new(|t| t[0].attention(None, 2)),
        ),
        (
            "attention d=16, 1 query",
            vec![vec![3, 1, 3 * 64]],
            Box::new(|t| t[0].attention(None, 4)),
        ),
        (
            "attention d=20",
            vec![vec![2, 33, 3 * 40]],
            Box::new(|t| t[0].attention(None, 2)),
        ),
        (
            // Lengths 1..200: past several 64-query blocks and key tiles, one empty sequence.
            "attention packed (varlen), d=32",
            vec![vec![347, 3 * h]], // lengths 5, 77, 0, 200, 1, 64
            Box::new(move |t| {
                let off = vec![0i64, 5, 82, 82, 282, 283, 347];
                let off = Tensor::from_vec(off, &[7], t[0].device())?;
                t[0].attention_packed(&off, 200, nh)
            }),
        ),
        (
            "attention packed, d=64, 2 heads",
            vec![vec![130 + 7, 3 * 128]],
            Box::new(|t| {
                let off = Tensor::from_vec(vec![0i64, 130, 137], &[3], t[0].device())?;
                t[0].attention_packed(&off, 130, 2)
            }),
        ),
    ];
    match_cpu_in_every_dtype(&g, &shapes);
}

/// Mean pooling + normalization (`sp_pool_rows`: 16-byte loads, the scalar form for rows that
/// are not whole chunks, packed and padded batches) against the CPU backend in every dtype: its
/// own test so that compute-sanitizer's racecheck of the pool kernel runs in seconds (the whole
/// of `half_ops_match_the_cpu_backend` under racecheck outruns 150 s).
#[test]
fn mean_pool_matches_the_cpu_backend() {
    let Some(g) = gpu() else { return };
    let (b, s, h) = (3, 77, 384);
    let shapes: Vec<HalfCase> = vec![
        (
            "mean_pool_normalize packed",
            vec![vec![347, h]],
            Box::new(|t| {
                let off = vec![0i64, 5, 82, 82, 282, 283, 347];
                let off = Tensor::from_vec(off, &[7], t[0].device())?;
                t[0].mean_pool_normalize_packed(&off)
            }),
        ),
        (
            "mean_pool_normalize",
            vec![vec![b, s, h]],
            Box::new(move |t| {
                let mask: Vec<f32> = (0..b * s)
                    .map(|i| (i % s < 5 + 30 * (i / s)) as u8 as f32)
                    .collect();
                t[0].mean_pool_normalize(&Tensor::from_vec(mask, &[b, s], t[0].device())?)
            }),
        ),
        (
            // Rows of 36 columns (not whole 16-byte chunks): sp_pool_rows' scalar loads.
            "mean_pool_normalize, 36 columns",
            vec![vec![3, 11, 36]],
            Box::new(|t| {
                let mask: Vec<f32> = (0..33)
                    .map(|i| (i % 11 < 2 + 4 * (i / 11)) as u8 as f32)
                    .collect();
                t[0].mean_pool_normalize(&Tensor::from_vec(mask, &[3, 11], t[0].device())?)
            }),
        ),
    ];
    match_cpu_in_every_dtype(&g, &shapes);
}

/// A named op over inputs of the given shapes (random, rounded to the dtype under test).
type HalfCase = (
    &'static str,
    Vec<Vec<usize>>,
    Box<dyn Fn(&[Tensor]) -> streampool::Result<Tensor>>,
);

/// Runs every case on `g` and on the CPU backend from identical rounded inputs, in F32, F16
/// and BF16: norm-relative error at most 1e-4 / 2e-3 / 2e-2 (2e-3 for TF32 in F32).
fn match_cpu_in_every_dtype(g: &Device, shapes: &[HalfCase]) {
    use streampool::DType;
    let cpu = Device::cpu();
    let norm_err = |a: &[f32], b: &[f32]| {
        assert!(a.iter().all(|x| x.is_finite()), "non-finite output");
        let e: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
        let n: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
        (e / n.max(1e-30)).sqrt()
    };
    for dt in [DType::F32, DType::F16, DType::BF16] {
        let tol = match dt {
            DType::F16 => 2e-3,
            DType::BF16 => 2e-2,
            _ => 1e-4,
        };
        for (i, (name, ins, op)) in shapes.iter().enumerate() {
            let tol = if *name == "matmul tf32" && dt == DType::F32 {
                2e-3
            } else {
                tol
            };
            let make = |dev: &Device| -> Vec<Tensor> {
                ins.iter()
                    .enumerate()
                    .map(|(j, sh)| {
                        Tensor::randn(sh, (i * 10 + j) as u64, dev)
                            .unwrap()
                            .to_dtype(dt)
                            .unwrap()
                    })
                    .collect()
            };
            let got = op(&make(g)).unwrap_or_else(|e| panic!("{name} {dt:?} on gpu: {e}"));
            let want = op(&make(&cpu)).unwrap();
            assert_eq!(got.dims(), want.dims(), "{name} {dt:?}");
            let f = |t: &Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let err = norm_err(&f(&got), &f(&want));
            println!("{name:24} {dt:?}: rel err {err:.2e}");
            assert!(
                err <= tol,
                "{name} {dt:?}: rel err {err:.2e} over {tol:.0e}"
            );
        }
    }
}

/// Attention at 65-128 keys and head width 32 (MiniLM's 128 tokens: two key tiles, two query
/// blocks per head) and the 16-byte-chunk gather against the CPU backend in f16 and bf16:
/// padded batches with masked keys, packed batches with empty, one-token, one-tile and
/// two-tile sequences. Small enough to run under compute-sanitizer. (A whole-sequence
/// attention kernel measured slower than the tiled one on these shapes.)
#[test]
fn attention_to_128_keys_and_chunked_gather_match_cpu() {
    use streampool::DType;
    let Some(g) = gpu() else { return };
    let cpu = Device::cpu();
    let (nh, d) = (12, 32);
    let h = nh * d;
    type Op = Box<dyn Fn(&[Tensor]) -> streampool::Result<Tensor>>;
    let cases: Vec<(&str, Vec<usize>, Op)> = vec![
        (
            "attention 40 x 128 keys, masked",
            vec![40, 128, 3 * h],
            Box::new(move |t| {
                let mask: Vec<f32> = (0..40 * 128)
                    .map(|i| (i % 128 < 128 - 3 * (i / 128)) as u8 as f32)
                    .collect();
                t[0].attention(
                    Some(&Tensor::from_vec(mask, &[40, 128], t[0].device())?),
                    nh,
                )
            }),
        ),
        (
            "attention 30 x 65 keys, no mask",
            vec![30, 65, 3 * h],
            Box::new(move |t| t[0].attention(None, nh)),
        ),
        (
            // Lengths 65, 1, 0, 128, 64; longest 128.
            "attention packed, longest 128",
            vec![258, 3 * h],
            Box::new(move |t| {
                let off = vec![0i64, 65, 66, 66, 194, 258];
                let off = Tensor::from_vec(off, &[6], t[0].device())?;
                t[0].attention_packed(&off, 128, nh)
            }),
        ),
        (
            "embedding, 16-byte chunks",
            vec![50, h],
            Box::new(|t| t[0].embedding(&[3, 0, 49, 3, 17, 22], &[2, 3])),
        ),
    ];
    for dt in [DType::F16, DType::BF16] {
        let tol = if dt == DType::F16 { 2e-3 } else { 2e-2 };
        for (i, (name, shape, op)) in cases.iter().enumerate() {
            let x = |dev: &Device| {
                vec![Tensor::randn(shape, 80 + i as u64, dev)
                    .unwrap()
                    .to_dtype(dt)
                    .unwrap()]
            };
            let f = |t: Tensor| t.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
            let got = f(op(&x(&g)).unwrap_or_else(|e| panic!("{name} {dt:?} on gpu: {e}")));
            let want = f(op(&x(&cpu)).unwrap());
            assert_eq!(got.len(), want.len(), "{name} {dt:?}");
            assert!(
                got.iter().all(|v| v.is_finite()),
                "{name} {dt:?}: non-finite"
            );
            let e: f64 = got
                .iter()
                .zip(&want)
                .map(|(a, b)| ((a - b) as f64).powi(2))
                .sum();
            let n: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
            let err = (e / n.max(1e-30)).sqrt();
            println!("{name:32} {dt:?}: rel err {err:.2e}");
            assert!(
                err <= tol,
                "{name} {dt:?}: rel err {err:.2e} over {tol:.0e}"
            );
        }
    }
}

/// The ops of the model families past BERT (RMSNorm, rotary positions, gated activations,
/// broadcasting) against the CPU backend: f32 within 1e-4, f16/bf16 within their rounding.
#[test]
fn model_family_ops_match_cpu() {
    use streampool::{DType, GateActivation};
    let Some(g) = gpu() else { return };
    for cols in [16, 128, 1024, 3000] {
        check(
            &format!("rms_norm cols={cols}"),
            &g,
            |d| vec![randn(&[7, cols], 70, d), randn(&[cols], 71, d)],
            |t| t[0].rms_norm(&t[1], 1e-6),
        );
    }
    let tables = |d: &Device| {
        let (c, s): (Vec<f32>, Vec<f32>) = (0..40)
            .flat_map(|p| (0..32).map(move |i| ((p * i) as f32 * 0.01).sin_cos()))
            .map(|(s, c)| (c, s))
            .unzip();
        (
            Tensor::from_vec(c, &[40, 32], d).unwrap(),
            Tensor::from_vec(s, &[40, 32], d).unwrap(),
        )
    };
    check(
        "rope",
        &g,
        |d| {
            let (c, s) = tables(d);
            vec![randn(&[3, 33, 4, 64], 72, d), c, s]
        },
        |t| t[0].rope(&t[1], &t[2]),
    );
    check(
        "rope on a head view",
        &g,
        |d| {
            let (c, s) = tables(d);
            vec![randn(&[2, 33, 12, 64], 73, d), c, s]
        },
        |t| t[0].narrow(2, 4, 4)?.rope(&t[1], &t[2]),
    );
    check(
        "rope on the queries and keys of a fused projection",
        &g,
        |d| {
            let (c, s) = tables(d);
            vec![randn(&[2, 33, 12, 64], 80, d), c, s]
        },
        |t| t[0].rope_heads(&t[1], &t[2], 8),
    );
    for act in [
        GateActivation::Gelu,
        GateActivation::GeluTanh,
        GateActivation::Silu,
    ] {
        check(
            &format!("gated_act {act:?}"),
            &g,
            |d| vec![randn(&[37, 2 * 300], 74, d).scale(3.0).unwrap()],
            |t| t[0].gated_act(act),
        );
    }
    check(
        "broadcast_as (grouped-query heads)",
        &g,
        |d| vec![randn(&[2, 2, 1, 9, 16], 75, d)],
        |t| t[0].broadcast_as(&[2, 2, 3, 9, 16])?.contiguous(),
    );
    // Half precision: both backends compute in f32 and round on store.
    let cpu = Device::cpu();
    for dt in [DType::F16, DType::BF16] {
        let run = |d: &Device, op: usize| -> Vec<f32> {
            let h = |t: Tensor| t.to_dtype(dt).unwrap();
            let (c, s) = tables(d);
            let y = match op {
                0 => h(randn(&[7, 1024], 76, d))
                    .rms_norm(&h(randn(&[1024], 77, d)), 1e-6)
                    .unwrap(),
                1 => h(randn(&[3, 33, 4, 64], 78, d)).rope(&c, &s).unwrap(),
                _ => h(randn(&[37, 600], 79, d))
                    .gated_act(GateActivation::Silu)
                    .unwrap(),
            };
            y.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap()
        };
        for op in 0..3 {
            let (got, want) = (run(&g, op), run(&cpu, op));
            let err = rel_err_vs_mean(&got, &want);
            assert!(err < 1e-2, "{dt:?} op {op}: relative error {err:e}");
        }
    }
}
