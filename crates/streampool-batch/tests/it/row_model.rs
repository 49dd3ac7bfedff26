//! RowModel with a real tensor MLP on the CPU device: batched rows equal rows run alone.

use std::time::Duration;

use streampool::{Activation, Device, Tensor};
use streampool_batch::{BatchConfig, BatchError, BatchQueue, RowModel};

use crate::util::close;

const IN: usize = 16;
const HIDDEN: usize = 32;
const OUT: usize = 8;

/// A 16-32-8 MLP with GELU, as one closure over its weights.
fn mlp(dev: &Device) -> impl Fn(&Tensor) -> streampool::Result<Tensor> + Send + Sync + 'static {
    let w1 = Tensor::randn(&[IN, HIDDEN], 1, dev).unwrap();
    let b1 = Tensor::randn(&[HIDDEN], 2, dev).unwrap();
    let w2 = Tensor::randn(&[HIDDEN, OUT], 3, dev).unwrap();
    let b2 = Tensor::randn(&[OUT], 4, dev).unwrap();
    move |x: &Tensor| {
        x.matmul(&w1)?
            .bias_act(&b1, Activation::Gelu)?
            .matmul(&w2)?
            .bias_act(&b2, Activation::Identity)
    }
}

fn row(i: usize) -> Vec<f32> {
    (0..IN)
        .map(|j| ((i * 31 + j * 7) % 23) as f32 / 11.0 - 1.0)
        .collect()
}

#[test]
fn batched_rows_equal_rows_run_one_at_a_time() {
    let dev = Device::cpu();
    let forward = mlp(&dev);
    let reference: Vec<Vec<f32>> = (0..64 * 4)
        .map(|i| {
            let x = Tensor::from_vec(row(i), &[1, IN], &dev).unwrap();
            forward(&x).unwrap().to_vec::<f32>().unwrap()
        })
        .collect();
    let config = BatchConfig {
        max_batch_size: 16,
        // The opt-in window (the default is none), so this path keeps a test too.
        max_wait: Duration::from_millis(2),
        max_queue: 1024,
        workers: 2,
        ..BatchConfig::default()
    };
    let queue = BatchQueue::new(RowModel::new(dev.clone(), IN, forward), config).unwrap();
    std::thread::scope(|s| {
        for t in 0..64 {
            let (queue, reference) = (&queue, &reference);
            s.spawn(move || {
                for k in 0..4 {
                    let i = t * 4 + k;
                    let out = queue.infer(row(i)).unwrap();
                    assert_eq!(out.len(), OUT);
                    assert!(
                        close(&out, &reference[i]),
                        "row {i}: {out:?} vs {:?}",
                        reference[i]
                    );
                }
            });
        }
    });
    let stats = queue.stats();
    assert_eq!(stats.completed, 256);
    assert!(stats.max_batch_seen() <= 16);
}

#[test]
fn a_malformed_row_is_refused_to_its_caller_only() {
    let dev = Device::cpu();
    let queue = BatchQueue::new(
        RowModel::new(dev.clone(), IN, mlp(&dev)),
        BatchConfig::default(),
    )
    .unwrap();
    assert!(matches!(
        queue.submit(vec![1.0; IN + 1]),
        Err(BatchError::InvalidInput(_))
    ));
    assert_eq!(queue.infer(row(3)).unwrap().len(), OUT);
}

#[test]
fn a_forward_with_the_wrong_output_shape_is_a_model_error() {
    let dev = Device::cpu();
    // Returns [features, batch] instead of [batch, out].
    let model = RowModel::new(dev.clone(), IN, |x: &Tensor| x.t()?.contiguous());
    let queue = BatchQueue::new(model, BatchConfig::default()).unwrap();
    match queue.infer(row(0)) {
        Err(BatchError::Model(msg)) => assert!(msg.to_string().contains("shape"), "{msg}"),
        other => panic!("expected a model error, got {other:?}"),
    }
}
