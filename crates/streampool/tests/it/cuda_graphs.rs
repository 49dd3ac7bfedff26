//! CUDA graphs on the GPU (feature `cuda`): replays against the eager path, concurrent
//! replays, capture failures, eviction, and the graph pool under slow streams and drops.
//! Every test returns early where there is no CUDA device.

use std::sync::{Arc, Barrier};
use std::time::Duration;

use streampool::{Activation, Device, DeviceConfig, GraphCache, StreamGuard, Tensor};

fn gpu() -> Option<Device> {
    match Device::cuda(0) {
        Ok(d) => Some(d),
        Err(e) => {
            eprintln!("no CUDA device, skipping ({e})");
            None
        }
    }
}

struct Mlp {
    w1: Tensor,
    b1: Tensor,
    w2: Tensor,
    b2: Tensor,
}

impl Mlp {
    fn new(dev: &Device) -> Self {
        Self {
            w1: Tensor::randn(&[256, 1024], 1, dev).unwrap(),
            b1: Tensor::randn(&[1024], 2, dev).unwrap(),
            w2: Tensor::randn(&[1024, 256], 3, dev).unwrap(),
            b2: Tensor::randn(&[256], 4, dev).unwrap(),
        }
    }
    fn forward(&self, x: &Tensor) -> streampool::Result<Tensor> {
        let h = x.matmul(&self.w1)?.bias_act(&self.b1, Activation::Gelu)?;
        h.matmul(&self.w2)?.bias_act(&self.b2, Activation::Identity)
    }
    fn run(&self, graphs: &GraphCache, x: &Tensor) -> Vec<f32> {
        let out = graphs
            .run("mlp", &[x], |i| {
                Ok::<_, streampool::Error>(vec![self.forward(&i[0])?])
            })
            .unwrap();
        assert_eq!(out.len(), 1);
        out[0].to_vec::<f32>().unwrap()
    }
}

#[test]
fn replay_is_bit_identical_to_eager() {
    let Some(g) = gpu() else { return };
    let mlp = Mlp::new(&g);
    let graphs = GraphCache::new(8).with_enabled(true);
    for seed in 0..6u64 {
        // Fresh random inputs every call: the graph must compute the function, not replay
        // a remembered result. Rows 1 and 3 give two keys.
        let rows = 1 + 2 * (seed as usize % 2);
        let x = Tensor::randn(&[rows, 256], 100 + seed, &g).unwrap();
        let eager = mlp.forward(&x).unwrap().to_vec::<f32>().unwrap();
        let got = mlp.run(&graphs, &x);
        assert!(eager.iter().all(|v| v.is_finite()));
        assert_eq!(got, eager, "call {seed}: graph result differs from eager");
    }
    let s = graphs.stats();
    assert_eq!((s.graphs, s.eager), (2, 0), "{s:?}");
}

#[test]
fn replays_from_64_threads_are_correct() {
    let Some(g) = gpu() else { return };
    let mlp = Arc::new(Mlp::new(&g));
    let graphs = Arc::new(GraphCache::new(256));
    let threads = 64;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (mlp, graphs, barrier) = (mlp.clone(), graphs.clone(), barrier.clone());
            std::thread::spawn(move || {
                let g = Device::cuda(0).unwrap();
                let xs: Vec<Tensor> = (0..4)
                    .map(|k| Tensor::randn(&[1, 256], 1000 + t as u64 * 8 + k, &g).unwrap())
                    .collect();
                let want: Vec<Vec<f32>> = xs
                    .iter()
                    .map(|x| mlp.forward(x).unwrap().to_vec::<f32>().unwrap())
                    .collect();
                barrier.wait();
                for it in 0..60 {
                    let k = (it + t) % xs.len();
                    assert_eq!(
                        mlp.run(&graphs, &xs[k]),
                        want[k],
                        "thread {t} iteration {it}"
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("replay thread");
    }
    let s = graphs.stats();
    eprintln!("graphs after 64 threads: {s:?}");
    assert!(s.graphs >= 1 && s.eager == 0, "{s:?}");
}

#[test]
fn a_closure_that_cannot_be_captured_runs_eagerly() {
    let Some(g) = gpu() else { return };
    let graphs = GraphCache::new(4);
    let x = Tensor::randn(&[4, 8], 5, &g).unwrap();
    // Traced once, then each capture tried fails; after the third the key runs eagerly.
    for _ in 0..4 {
        // A host read inside the closure cannot be captured.
        let out = graphs
            .run("host-read", &[&x], |i| {
                let v = i[0].to_vec::<f32>()?;
                Ok::<_, streampool::Error>(vec![Tensor::from_vec(v, &[4, 8], &g)?.relu()?])
            })
            .unwrap();
        assert_eq!(
            out[0].to_vec::<f32>().unwrap(),
            x.relu().unwrap().to_vec::<f32>().unwrap()
        );
    }
    let s = graphs.stats();
    assert_eq!((s.graphs, s.eager), (0, 1), "{s:?}");
    // The device still works after the failed capture.
    assert_eq!(
        x.scale(2.0).unwrap().to_vec::<f32>().unwrap(),
        x.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|v| v * 2.0)
            .collect::<Vec<_>>()
    );
}

#[test]
fn the_memory_budget_bounds_pools_and_keeps_large_shapes_eager() {
    let Some(g) = gpu() else { return };
    let mlp = Mlp::new(&g);
    // Rows r allocate about 11 KB each in the MLP (input, two hidden and two output
    // activations, f32): with a 16 MiB budget, 8..=128 rows are captured, 2048 rows (about
    // 23 MB, over an eighth of the budget) stay eager, and the pools of all the small
    // shapes (about 17 MB together) do not fit, so the oldest are evicted.
    let budget = 16 << 20;
    let graphs = GraphCache::new(64).with_max_bytes(budget);
    for rows in [8usize, 16, 32, 48, 64, 80, 96, 112, 128, 2048, 8, 2048] {
        let x = Tensor::randn(&[rows, 256], rows as u64, &g).unwrap();
        let eager = mlp.forward(&x).unwrap().to_vec::<f32>().unwrap();
        for _ in 0..3 {
            assert_eq!(mlp.run(&graphs, &x), eager, "{rows} rows");
        }
    }
    let s = graphs.stats();
    assert_eq!(s.eager, 1, "the 2048-row shape stays eager: {s:?}");
    assert!(s.graphs >= 1, "small shapes are still captured: {s:?}");
    assert!(s.pool_bytes <= budget, "the pools fit the budget: {s:?}");
}

#[test]
fn eviction_keeps_results_right_and_memory_bounded() {
    let Some(g) = gpu() else { return };
    let mlp = Mlp::new(&g);
    let graphs = GraphCache::new(2);
    for round in 0..3 {
        for rows in 1..=5usize {
            let x = Tensor::randn(&[rows, 256], 10 * rows as u64 + round, &g).unwrap();
            let eager = mlp.forward(&x).unwrap().to_vec::<f32>().unwrap();
            for _ in 0..3 {
                assert_eq!(mlp.run(&graphs, &x), eager, "round {round}, {rows} rows");
            }
        }
    }
    let s = graphs.stats();
    assert!(s.graphs + s.seen + s.eager <= 2, "{s:?}");
    graphs.clear();
    assert_eq!(graphs.stats().graphs, 0);
}

#[test]
fn graph_inputs_and_pool_are_not_reused_under_a_slow_stream() {
    let Some(_g) = gpu() else { return };
    // A separate device with a tight limit, so freed blocks are reused at once where allowed.
    let shape = [256, 256];
    let bytes = 256 * 256 * 4;
    let dev = Device::cuda_with(
        0,
        DeviceConfig {
            memory_limit: Some(12 * bytes),
            ..DeviceConfig::default()
        },
    )
    .unwrap();
    let (slow, fast) = (
        dev.stream_from_pool().unwrap(),
        dev.stream_from_pool().unwrap(),
    );
    let graphs = GraphCache::new(4);
    let f = |i: &[Tensor]| Ok::<_, streampool::Error>(vec![i[0].scale(3.0)?.sum(1, false)?]);
    for round in 0..6 {
        let x = {
            let _s = StreamGuard::new(&fast);
            Tensor::ones(&shape, &dev).unwrap()
        };
        let out = {
            let _s = StreamGuard::new(&slow);
            slow.debug_delay(Duration::from_millis(60)).unwrap();
            let out = graphs.run("slow", &[&x], f).unwrap().remove(0);
            // Drop the input while the replay (and its copy-in) is still queued behind the
            // delay; on round 4 drop every graph too, so its pool goes back while in use.
            drop(x);
            if round == 4 {
                graphs.clear();
            }
            out
        };
        let _s = StreamGuard::new(&fast);
        // Fill fresh memory on another stream: it must never land on memory the slow stream
        // still reads or writes.
        let fills: Vec<Tensor> = (0..6)
            .map(|_| Tensor::full(-5.0, &shape, &dev).unwrap())
            .collect();
        for t in &fills {
            assert!(t.to_vec::<f32>().unwrap().iter().all(|&v| v == -5.0));
        }
        let got = out.to_vec::<f32>().unwrap();
        assert!(
            got.iter().all(|&v| v == 768.0),
            "round {round}: the slow stream's graph read reused memory"
        );
    }
    dev.synchronize().unwrap();
    eprintln!("allocator: {:?}", dev.allocator_stats());
}

#[test]
fn host_graphs_match_eager_from_64_threads() {
    let Some(g) = gpu() else { return };
    let mlp = Arc::new(Mlp::new(&g));
    let graphs = Arc::new(GraphCache::new(256));
    let threads = 64;
    let barrier = Arc::new(Barrier::new(threads));
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (mlp, graphs, barrier) = (mlp.clone(), graphs.clone(), barrier.clone());
            std::thread::spawn(move || {
                let g = Device::cuda(0).unwrap();
                let rows: Vec<Vec<f32>> = (0..3)
                    .map(|k| {
                        Tensor::randn(&[1, 256], 5000 + t as u64 * 4 + k, &g)
                            .unwrap()
                            .to_vec::<f32>()
                            .unwrap()
                    })
                    .collect();
                let want: Vec<Vec<f32>> = rows
                    .iter()
                    .map(|r| {
                        let x = Tensor::from_slice(r, &[1, 256], &g).unwrap();
                        mlp.forward(&x).unwrap().to_vec::<f32>().unwrap()
                    })
                    .collect();
                barrier.wait();
                for it in 0..60 {
                    let k = (it + t) % rows.len();
                    let out = graphs
                        .run_host("mlp", &g, &[(&rows[k][..], &[1, 256][..])], |i| {
                            Ok::<_, streampool::Error>(vec![mlp.forward(&i[0])?])
                        })
                        .unwrap();
                    assert_eq!(out, vec![want[k].clone()], "thread {t} iteration {it}");
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("host graph thread");
    }
    let s = graphs.stats();
    eprintln!("host graphs after 64 threads: {s:?}");
    assert!(s.graphs >= 1 && s.eager == 0, "{s:?}");
}
