//! The `Replicas` router: least-outstanding routing (by rows and by cost), a busy replica
//! skipped, answers back to their own callers from many threads, a failing or shut-down
//! replica isolated, nothing lost. Gates hold batches inside the model so the loads the
//! router sees are exact, never a matter of timing.

use std::sync::Arc;
use std::time::Duration;

use crate::util::{eventually, Tagger, HANG_GUARD};
use streampool::{Device, DeviceConfig, Tensor};
use streampool_batch::{
    BatchConfig, BatchContext, BatchError, BatchModel, Handle, ModelError, Replicas, RowModel,
};

fn config(max_batch_size: usize) -> BatchConfig {
    BatchConfig {
        max_batch_size,
        max_queue: 4096,
        workers: 2,
        ..BatchConfig::default()
    }
}

fn answer<O>(h: Handle<O>) -> Result<O, BatchError> {
    assert!(
        h.wait_timeout(HANG_GUARD),
        "no answer within the hang guard"
    );
    h.wait()
}

fn taggers(n: usize, gated: usize) -> (Vec<Arc<Tagger>>, Replicas<Arc<Tagger>>) {
    let models: Vec<Arc<Tagger>> = (0..n).map(|_| Arc::new(Tagger::gated(gated))).collect();
    let replicas = Replicas::new(
        models
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("r{i}"), m.clone())),
        config(1),
    )
    .unwrap();
    (models, replicas)
}

#[test]
fn idle_replicas_share_requests_evenly() {
    // Every batch waits at its gate, so nothing is answered and each submit sees the exact
    // outstanding counts: 3 replicas x 4 requests each.
    let (models, replicas) = taggers(3, usize::MAX);
    let handles: Vec<_> = (0..12u64).map(|t| replicas.submit(t).unwrap()).collect();
    let routed: Vec<u64> = replicas.stats().iter().map(|r| r.routed).collect();
    assert_eq!(routed, vec![4, 4, 4]);
    assert_eq!(replicas.outstanding(), 12);
    for m in &models {
        m.gate.open();
    }
    for (t, h) in (0..12u64).zip(handles) {
        assert_eq!(answer(h).unwrap(), 2 * t + 1);
    }
    assert!(eventually(|| replicas.outstanding() == 0));
}

#[test]
fn a_busy_replica_gets_no_requests_while_others_are_idle() {
    // Replica 0 holds its first batch at the gate; replica 1 answers at once. Each request
    // waits for its answer before the next, so replica 1 is always idle when asked.
    let slow = Arc::new(Tagger::gated(1));
    let fast = Arc::new(Tagger::default());
    let replicas =
        Replicas::new([("slow", slow.clone()), ("fast", fast.clone())], config(1)).unwrap();
    // Ties go round-robin: the first two requests land one on each replica. Keep the slow
    // replica's handle; it stays outstanding.
    let first = replicas.submit(1000).unwrap();
    let second = replicas.submit(1001).unwrap();
    assert!(
        slow.gate.wait_entered(1),
        "the slow replica never got a request"
    );
    assert_eq!(answer(second).unwrap(), 2003);
    for t in 0..20u64 {
        assert_eq!(replicas.infer(t).unwrap(), 2 * t + 1);
    }
    let stats = replicas.stats();
    assert_eq!((stats[0].routed, stats[1].routed), (1, 21));
    assert_eq!(stats[0].outstanding, 1);
    slow.gate.open();
    assert_eq!(answer(first).unwrap(), 2001);
}

/// Answers `x` with `x + 1`; a request's cost is `x` (think: its token count).
struct Weighed {
    gate: crate::util::Gate,
}

impl BatchModel for Weighed {
    type Input = u64;
    type Output = u64;
    fn forward_batch(&self, xs: Vec<u64>, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
        assert!(self.gate.pass(), "gate never opened");
        Ok(xs.into_iter().map(|x| x + 1).collect())
    }
    fn cost(&self, x: &u64) -> u64 {
        *x
    }
}

#[test]
fn routing_balances_cost_not_request_count() {
    let models: Vec<Arc<Weighed>> = (0..2)
        .map(|_| {
            Arc::new(Weighed {
                gate: crate::util::Gate::default(),
            })
        })
        .collect();
    let replicas = Replicas::new(
        models
            .iter()
            .enumerate()
            .map(|(i, m)| (i.to_string(), m.clone())),
        config(1),
    )
    .unwrap();
    // One request of cost 10, then ten of cost 1: the ten all go to the other replica
    // (its load reaches 10 only with the tenth), so the first replica holds one request.
    let mut handles = vec![(10, replicas.submit(10).unwrap())];
    handles.extend((0..10).map(|_| (1, replicas.submit(1).unwrap())));
    let stats = replicas.stats();
    let mut routed: Vec<u64> = stats.iter().map(|r| r.routed).collect();
    routed.sort_unstable();
    assert_eq!(routed, vec![1, 10]);
    assert_eq!(
        stats.iter().map(|r| r.outstanding).collect::<Vec<_>>(),
        vec![10, 10]
    );
    for m in &models {
        m.gate.open();
    }
    for (x, h) in handles {
        assert_eq!(answer(h).unwrap(), x + 1);
    }
    assert!(eventually(|| replicas.outstanding() == 0));
}

#[test]
fn answers_return_to_their_callers_from_many_threads() {
    let (models, replicas) = taggers(3, 0);
    std::thread::scope(|s| {
        for t in 0..32u64 {
            let replicas = &replicas;
            s.spawn(move || {
                for j in 0..50u64 {
                    let tag = t * 1000 + j;
                    assert_eq!(replicas.infer(tag).unwrap(), 2 * tag + 1);
                }
            });
        }
    });
    let stats = replicas.stats();
    let routed: u64 = stats.iter().map(|r| r.routed).sum();
    let completed: u64 = stats.iter().map(|r| r.queue.completed).sum();
    assert_eq!((routed, completed), (32 * 50, 32 * 50));
    // Each request ran exactly once, on exactly one replica.
    let mut ran: Vec<u64> = models.iter().flat_map(|m| m.ran()).collect();
    ran.sort_unstable();
    let expected: Vec<u64> = (0..32u64)
        .flat_map(|t| (0..50).map(move |j| t * 1000 + j))
        .collect();
    assert_eq!(ran, expected);
    for (m, r) in models.iter().zip(&stats) {
        assert_eq!(m.ran().len() as u64, r.routed, "replica {}", r.label);
    }
    assert!(eventually(|| replicas.outstanding() == 0));
}

/// Answers `x` with `x + 7`, or fails every batch when `broken`.
struct MaybeBroken {
    broken: bool,
}

impl BatchModel for MaybeBroken {
    type Input = u64;
    type Output = u64;
    fn forward_batch(&self, xs: Vec<u64>, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
        if self.broken {
            return Err("replica broken".into());
        }
        Ok(xs.into_iter().map(|x| x + 7).collect())
    }
}

#[test]
fn a_failing_replica_fails_only_its_own_requests() {
    let replicas = Replicas::new(
        [
            ("ok-a", MaybeBroken { broken: false }),
            ("broken", MaybeBroken { broken: true }),
            ("ok-b", MaybeBroken { broken: false }),
        ],
        config(4),
    )
    .unwrap();
    let (ok, failed) = std::thread::scope(|s| {
        let workers: Vec<_> = (0..8u64)
            .map(|t| {
                let replicas = &replicas;
                s.spawn(move || {
                    let (mut ok, mut failed) = (0u64, 0u64);
                    for j in 0..40u64 {
                        let x = t * 100 + j;
                        match replicas.infer(x) {
                            Ok(y) => {
                                assert_eq!(y, x + 7);
                                ok += 1;
                            }
                            Err(BatchError::Model(msg)) => {
                                assert!(msg.to_string().contains("replica broken"), "{msg}");
                                failed += 1;
                            }
                            Err(other) => panic!("unexpected error {other}"),
                        }
                    }
                    (ok, failed)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().unwrap())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    });
    assert_eq!(ok + failed, 8 * 40, "every request answered once");
    let stats = replicas.stats();
    assert_eq!(failed, stats[1].routed);
    assert_eq!(stats[1].queue.failed, stats[1].routed);
    assert_eq!(stats[1].queue.completed, 0);
    assert_eq!(ok, stats[0].queue.completed + stats[2].queue.completed);
    assert_eq!(stats[0].queue.failed + stats[2].queue.failed, 0);
}

#[test]
fn a_shut_down_replica_is_skipped_and_a_full_set_refuses() {
    let (_models, replicas) = taggers(2, 0);
    replicas.replica(0).unwrap().shutdown();
    assert!(!replicas.is_accepting());
    for t in 0..10u64 {
        assert_eq!(replicas.infer(t).unwrap(), 2 * t + 1);
    }
    assert_eq!(replicas.stats()[1].routed, 10);
    replicas.shutdown();
    assert_eq!(replicas.infer(1), Err(BatchError::ShutDown));
}

#[test]
fn refusals_of_the_input_itself_are_not_retried() {
    let dev = Device::cpu();
    let replicas = Replicas::new(
        (0..2).map(|i| {
            (
                i.to_string(),
                RowModel::new(dev.clone(), 3, |x: &Tensor| x.relu()),
            )
        }),
        config(4),
    )
    .unwrap();
    assert!(matches!(
        replicas.infer(vec![1.0]),
        Err(BatchError::InvalidInput(_))
    ));
    assert!(matches!(
        Replicas::new(Vec::<(String, Arc<Tagger>)>::new(), config(1)),
        Err(BatchError::Config(_))
    ));
    assert!(matches!(
        Replicas::new(
            [
                ("x", Arc::new(Tagger::default())),
                ("x", Arc::new(Tagger::default()))
            ],
            config(1)
        ),
        Err(BatchError::Config(_))
    ));
}

#[test]
fn mlp_replicas_on_separate_cpu_devices_match_the_reference() {
    // Two distinct CPU devices (own stream pools and allocators), one copy of the weights
    // on each, like one replica per GPU.
    let devices: Vec<Device> = (0..2)
        .map(|_| Device::cpu_with(DeviceConfig::default()).unwrap())
        .collect();
    assert!(!devices[0].same(&devices[1]));
    let weights: Vec<f32> = (0..8 * 4)
        .map(|i| ((i * 7) % 11) as f32 / 11.0 - 0.5)
        .collect();
    let replicas = Replicas::new(
        devices.iter().enumerate().map(|(i, dev)| {
            let w = Tensor::from_vec(weights.clone(), &[8, 4], dev).unwrap();
            (
                format!("cpu:{i}"),
                RowModel::new(dev.clone(), 8, move |x: &Tensor| x.matmul(&w)?.relu()),
            )
        }),
        config(8),
    )
    .unwrap();
    let reference = |row: &[f32]| -> Vec<f32> {
        (0..4)
            .map(|c| {
                (0..8)
                    .map(|k| row[k] * weights[k * 4 + c])
                    .sum::<f32>()
                    .max(0.0)
            })
            .collect()
    };
    std::thread::scope(|s| {
        for t in 0..8usize {
            let (replicas, reference) = (&replicas, &reference);
            s.spawn(move || {
                for j in 0..40usize {
                    let row: Vec<f32> = (0..8)
                        .map(|k| ((t * 31 + j * 7 + k) % 13) as f32 - 6.0)
                        .collect();
                    let out = replicas.infer(row.clone()).unwrap();
                    for (a, b) in out.iter().zip(reference(&row)) {
                        assert!((a - b).abs() <= 1e-4 * b.abs().max(1.0), "{a} vs {b}");
                    }
                }
            });
        }
    });
    let stats = replicas.stats();
    assert_eq!(stats.iter().map(|r| r.queue.completed).sum::<u64>(), 8 * 40);
    for r in &stats {
        if r.routed > 0 {
            assert!(
                r.queue.busy > Duration::ZERO,
                "{} ran batches but no busy time",
                r.label
            );
        }
    }
}
