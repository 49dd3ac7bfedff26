//! Graphs on the CPU backend: `GraphCache::run` is the eager path there, so model code that
//! uses graphs runs unchanged in CI. (The GPU suite `cuda_graphs.rs` checks real graphs.)

use streampool::{Device, Error, GraphCache, Tensor};

#[test]
fn graph_cache_on_cpu_runs_the_closure_eagerly() {
    let dev = Device::cpu();
    let w = Tensor::randn(&[8, 8], 1, &dev).unwrap();
    let graphs = GraphCache::new(4);
    for seed in 0..4 {
        let x = Tensor::randn(&[3, 8], 10 + seed, &dev).unwrap();
        let want = x
            .matmul(&w)
            .unwrap()
            .gelu()
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let got = graphs
            .run("mm", &[&x], |i| {
                Ok::<_, Error>(vec![i[0].matmul(&w)?.gelu()?])
            })
            .unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].to_vec::<f32>().unwrap(), want);
    }
    // Nothing is captured or traced on a backend without graphs.
    let s = graphs.stats();
    assert_eq!((s.graphs, s.seen, s.eager), (0, 0, 0));
}

#[test]
fn graph_cache_passes_errors_through_and_works_from_threads() {
    let dev = Device::cpu();
    let graphs = std::sync::Arc::new(GraphCache::new(4));
    let x = Tensor::randn(&[2, 3], 1, &dev).unwrap();
    let y = Tensor::randn(&[4, 5], 2, &dev).unwrap();
    let err = graphs
        .run("bad", &[&x, &y], |i| {
            Ok::<_, Error>(vec![i[0].matmul(&i[1])?])
        })
        .expect_err("a shape error");
    assert!(matches!(err, Error::Shape { .. }), "{err}");
    let handles: Vec<_> = (0..4)
        .map(|t| {
            let graphs = graphs.clone();
            std::thread::spawn(move || {
                let dev = Device::cpu();
                let x = Tensor::randn(&[2, 2], t, &dev).unwrap();
                let out = graphs
                    .run("relu", &[&x], |i| Ok::<_, Error>(vec![i[0].relu()?]))
                    .unwrap();
                assert_eq!(
                    out[0].to_vec::<f32>().unwrap(),
                    x.relu().unwrap().to_vec::<f32>().unwrap()
                );
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}
