//! The batching and admission policy: no wait while a worker is free, batches that grow only
//! while workers are busy (a pipelined preparer included), the token budget, groups admitted
//! all or none, a bulk request admitted when nothing waits, and refusals only when the
//! estimated wait exceeds a deadline or `max_queue_wait`, with the estimate carried. Gates
//! hold batches inside the model, so every queue state is reached deterministically; the one
//! timing assertion bounds an idle request's answer by a second.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{eventually, Gate, Tagger, HANG_GUARD};
use parking_lot::Mutex;
use streampool_batch::{
    BatchConfig, BatchContext, BatchError, BatchModel, BatchQueue, Handle, ModelError, Overload,
    Replicas,
};

fn answer<O>(h: Handle<O>) -> Result<O, BatchError> {
    assert!(
        h.wait_timeout(HANG_GUARD),
        "no answer within the hang guard"
    );
    h.wait()
}

fn one_worker(max_batch_size: usize) -> BatchConfig {
    BatchConfig {
        max_batch_size,
        workers: 1,
        ..BatchConfig::default()
    }
}

/// [`Tagger`] with a preparation step (the trait's default one), so each worker is a
/// preparing and a running stage.
#[derive(Default)]
struct Piped(Tagger);

impl BatchModel for Piped {
    type Input = u64;
    type Output = u64;
    fn forward_batch(&self, xs: Vec<u64>, ctx: &BatchContext) -> Result<Vec<u64>, ModelError> {
        self.0.forward_batch(xs, ctx)
    }
    fn prepares(&self) -> bool {
        true
    }
}

/// Inputs `(tag, tokens)`: answers `2 tag + 1`, records every batch, holds its batch number
/// `hold` (counting from 1; 0: none) at the gate, sleeps `sleep` per batch, and refuses an
/// input of no tokens.
#[derive(Default)]
struct Lengths {
    gate: Gate,
    hold: usize,
    sleep: Duration,
    /// Declares that it runs batches packed (the budget then counts tokens).
    packs: bool,
    batches: Mutex<Vec<Vec<(u64, usize)>>>,
}

impl BatchModel for Lengths {
    type Input = (u64, usize);
    type Output = u64;

    fn forward_batch(
        &self,
        xs: Vec<(u64, usize)>,
        _: &BatchContext,
    ) -> Result<Vec<u64>, ModelError> {
        let index = {
            let mut b = self.batches.lock();
            b.push(xs.clone());
            b.len()
        };
        if index == self.hold {
            assert!(self.gate.pass(), "gate never opened");
        }
        std::thread::sleep(self.sleep);
        Ok(xs.into_iter().map(|(t, _)| 2 * t + 1).collect())
    }

    fn input_len(&self, x: &(u64, usize)) -> usize {
        x.1
    }

    fn packs(&self) -> bool {
        self.packs
    }

    fn check_input(&self, x: &(u64, usize)) -> Result<(), ModelError> {
        if x.1 == 0 {
            return Err("an input has no tokens".into());
        }
        Ok(())
    }
}

#[test]
fn an_idle_queue_answers_without_waiting_for_a_window() {
    assert!(BatchConfig::default().max_wait.is_zero());
    let window = Duration::from_secs(1);
    // Default (no window): one request alone is answered at once, plain and pipelined.
    let plain = BatchQueue::new(Tagger::default(), BatchConfig::default()).unwrap();
    let piped = BatchQueue::new(Piped::default(), BatchConfig::default()).unwrap();
    let t = Instant::now();
    assert_eq!(plain.infer(3), Ok(7));
    assert_eq!(piped.infer(4), Ok(9));
    let idle = t.elapsed();
    // The opt-in window: the same request waits the whole window for company first.
    let waiting = BatchQueue::new(
        Tagger::default(),
        BatchConfig {
            max_wait: window,
            ..BatchConfig::default()
        },
    )
    .unwrap();
    let t = Instant::now();
    assert_eq!(waiting.infer(5), Ok(11));
    let windowed = t.elapsed();
    assert!(
        windowed >= window,
        "the opt-in window was not held: {windowed:?}"
    );
    assert!(
        idle < window,
        "two idle requests took {idle:?}, no faster than a {window:?} window"
    );
}

#[test]
fn batches_grow_only_while_the_worker_is_busy() {
    let model = Arc::new(Tagger::gated(1));
    let queue = BatchQueue::new(model.clone(), one_worker(32)).unwrap();
    let first = queue.submit(0).unwrap();
    assert!(model.gate.wait_entered(1));
    let behind: Vec<_> = (1..=20u64).map(|t| queue.submit(t).unwrap()).collect();
    model.gate.open();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(behind) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    // Idle again: each lone request runs at once, as its own batch.
    for t in 21..24u64 {
        assert_eq!(queue.infer(t), Ok(2 * t + 1));
    }
    let mut expected = vec![vec![0], (1..=20).collect::<Vec<u64>>()];
    expected.extend((21..24).map(|t| vec![t]));
    assert_eq!(*model.batches.lock(), expected);
}

/// A pipelined preparer must not take the first request that arrives behind a running
/// batch and sit on it: it holds until its runner is free (or a full batch waits), so
/// everything that arrived meanwhile forms one batch.
#[test]
fn a_pipelined_preparer_forms_from_everything_that_arrived_while_its_runner_ran() {
    let model = Arc::new(Piped(Tagger::gated(1)));
    let queue = BatchQueue::new(model.clone(), one_worker(32)).unwrap();
    let first = queue.submit(0).unwrap();
    assert!(model.0.gate.wait_entered(1));
    let behind: Vec<_> = (1..=20u64).map(|t| queue.submit(t).unwrap()).collect();
    assert_eq!(
        queue.queue_len(),
        20,
        "nothing was taken while the runner was busy"
    );
    model.0.gate.open();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(behind) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    let expected = vec![vec![0], (1..=20).collect::<Vec<u64>>()];
    assert_eq!(*model.0.batches.lock(), expected);
}

/// A full batch waiting is formed (and prepared) at once, one batch ahead of the runner.
#[test]
fn a_pipelined_preparer_forms_a_full_batch_at_once() {
    let model = Arc::new(Piped(Tagger::gated(1)));
    let queue = BatchQueue::new(model.clone(), one_worker(4)).unwrap();
    let first = queue.submit(0).unwrap();
    assert!(model.0.gate.wait_entered(1));
    let behind: Vec<_> = (1..=8u64).map(|t| queue.submit(t).unwrap()).collect();
    // Batch [1, 2, 3, 4] is formed and prepared while batch 0 is held in the model.
    assert!(eventually(|| queue.stats().prepared_batches == 2));
    assert_eq!(queue.queue_len(), 4);
    model.0.gate.open();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(behind) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    let expected = vec![vec![0], vec![1, 2, 3, 4], vec![5, 6, 7, 8]];
    assert_eq!(*model.0.batches.lock(), expected);
}

/// A model that packs its batches (no padding) is budgeted by the sum of its inputs'
/// tokens: the same inputs as the padded test below form fewer, fuller batches.
#[test]
fn a_packing_model_is_budgeted_by_its_tokens() {
    let model = Arc::new(Lengths {
        hold: 1,
        packs: true,
        ..Lengths::default()
    });
    let config = BatchConfig {
        max_batch_tokens: 64,
        ..one_worker(100)
    };
    let queue = BatchQueue::new(model.clone(), config).unwrap();
    let first = queue.submit((0, 1)).unwrap();
    assert!(model.gate.wait_entered(1));
    let lens = [10, 10, 10, 30, 5, 5, 100, 3, 3, 3, 20, 20, 20];
    let handles: Vec<_> = (1u64..)
        .zip(lens)
        .map(|x| queue.submit(x).unwrap())
        .collect();
    model.gate.open();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(handles) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    let lens_of: Vec<Vec<usize>> = model
        .batches
        .lock()
        .iter()
        .map(|b| b.iter().map(|x| x.1).collect())
        .collect();
    // Sum of tokens <= 64 (padded, the same inputs took 7 batches).
    assert_eq!(
        lens_of,
        vec![
            vec![1],
            vec![10, 10, 10, 30],
            vec![5, 5],
            vec![100],
            vec![3, 3, 3, 20, 20],
            vec![20],
        ]
    );
    let stats = queue.stats();
    assert_eq!(stats.completed, 14);
}

#[test]
fn the_token_budget_bounds_every_batch_and_an_oversized_input_runs_alone() {
    let model = Arc::new(Lengths {
        hold: 1,
        ..Lengths::default()
    });
    let config = BatchConfig {
        max_batch_tokens: 64,
        ..one_worker(100)
    };
    let queue = BatchQueue::new(model.clone(), config).unwrap();
    let first = queue.submit((0, 1)).unwrap();
    assert!(model.gate.wait_entered(1));
    let lens = [10, 10, 10, 30, 5, 5, 100, 3, 3, 3, 20, 20, 20];
    let handles: Vec<_> = (1u64..)
        .zip(lens)
        .map(|x| queue.submit(x).unwrap())
        .collect();
    model.gate.open();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(handles) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    let batches = model.batches.lock().clone();
    let lens_of: Vec<Vec<usize>> = batches
        .iter()
        .map(|b| b.iter().map(|x| x.1).collect())
        .collect();
    // rows x longest <= 64, taken oldest first, stopping at the first input that does not
    // fit (30 after three 10s; 100 alone; 20 after three 3s).
    assert_eq!(
        lens_of,
        vec![
            vec![1],
            vec![10, 10, 10],
            vec![30, 5],
            vec![5],
            vec![100],
            vec![3, 3, 3],
            vec![20, 20, 20],
        ]
    );
    for b in &lens_of {
        let cost = b.len() * b.iter().max().unwrap();
        assert!(cost <= 64 || b.len() == 1, "{b:?}");
    }
    let tags: Vec<u64> = batches.iter().flatten().map(|x| x.0).collect();
    assert_eq!(tags, (0..=13).collect::<Vec<_>>(), "first in, first run");
    let stats = queue.stats();
    // Costs 1, 30, 60, 5, 100, 9, 60: log2 buckets 0, 4, 5, 2, 6, 3, 5.
    assert_eq!(stats.batch_tokens, vec![1, 0, 1, 1, 1, 2, 1]);
    assert!((stats.mean_batch_tokens - 265.0 / 7.0).abs() < 1e-9);
}

#[test]
fn a_group_is_admitted_or_refused_as_one() {
    let model = Arc::new(Lengths {
        hold: 1,
        ..Lengths::default()
    });
    let config = BatchConfig {
        max_queue: 2,
        max_queue_tokens: 40,
        ..one_worker(8)
    };
    let queue = BatchQueue::new(model.clone(), config).unwrap();
    let first = queue.submit((0, 1)).unwrap();
    assert!(model.gate.wait_entered(1));
    let g1 = queue.submit_group(vec![(1, 5), (2, 5), (3, 5)]).unwrap();
    assert_eq!((queue.queued_requests(), queue.queue_len()), (1, 3));
    // One input the model refuses refuses its whole group; nothing of it is queued.
    assert!(matches!(
        queue.submit_group(vec![(4, 5), (5, 0)]),
        Err(BatchError::InvalidInput(_))
    ));
    // 15 tokens wait; 30 more would pass the cap of 40.
    let too_many_tokens = queue.submit_group(vec![(4, 10), (5, 10), (6, 10)]);
    assert!(matches!(
        too_many_tokens,
        Err(BatchError::QueueFull {
            reason: Overload::Tokens {
                queued: 15,
                asked: 30,
                capacity: 40
            },
            ..
        })
    ));
    let g2 = queue.submit_group(vec![(4, 10), (5, 10)]).unwrap();
    assert_eq!(
        (
            queue.queued_requests(),
            queue.queue_len(),
            queue.queued_tokens()
        ),
        (2, 5, 35)
    );
    // Two requests wait: a third, of any size, is refused.
    assert!(matches!(
        queue.submit((6, 1)),
        Err(BatchError::QueueFull {
            reason: Overload::Requests { capacity: 2 },
            ..
        })
    ));
    assert_eq!(queue.queue_len(), 5, "refused groups queue nothing");
    let stats = queue.stats();
    assert_eq!((stats.submitted, stats.rejected), (6, 4));
    model.gate.open();
    assert_eq!(answer(first), Ok(1));
    let outs: Vec<u64> = g1
        .into_iter()
        .chain(g2)
        .map(|h| answer(h).unwrap())
        .collect();
    assert_eq!(outs, vec![3, 5, 7, 9, 11]);
    // A group leaves the request count only when its last input is taken.
    assert!(eventually(|| queue.queued_requests() == 0));
}

#[test]
fn a_bulk_request_is_admitted_when_nothing_waits() {
    let model = Arc::new(Lengths::default());
    // Caps a bulk request exceeds many times over, and a 1 us wait bound.
    let config = BatchConfig {
        max_queue: 1,
        max_queue_tokens: 16,
        max_queue_wait: Some(Duration::from_micros(1)),
        max_batch_tokens: 256,
        ..one_worker(32)
    };
    let queue = BatchQueue::new(model.clone(), config).unwrap();
    for round in 0..6u64 {
        let inputs: Vec<(u64, usize)> = (0..256).map(|i| (round * 1000 + i, 8)).collect();
        let want: Vec<u64> = inputs.iter().map(|x| 2 * x.0 + 1).collect();
        assert_eq!(queue.infer_group(inputs), Ok(want), "round {round}");
    }
    let stats = queue.stats();
    assert_eq!((stats.completed, stats.rejected), (6 * 256, 0));
    assert!(stats.service_rate.is_some(), "the rate was measured");
    assert!(model.batches.lock().iter().all(|b| b.len() <= 32));
}

/// Batches of one 100-token input that each take at least 20 ms: the measured rate is at
/// most 5,000 tokens/s whatever the machine's load, so an estimated wait has a lower bound
/// the tests can rely on. The queue is warmed with 4 batches (the estimate's minimum), and
/// its 5th batch will be held at the gate.
fn slow_queue(max_queue_wait: Option<Duration>) -> (Arc<Lengths>, BatchQueue<Arc<Lengths>>) {
    let model = Arc::new(Lengths {
        hold: 5,
        sleep: Duration::from_millis(20),
        ..Lengths::default()
    });
    let config = BatchConfig {
        max_queue_wait,
        ..one_worker(1)
    };
    let queue = BatchQueue::new(model.clone(), config).unwrap();
    for t in 0..4u64 {
        assert_eq!(queue.infer((t, 100)), Ok(2 * t + 1));
    }
    assert!(queue.stats().service_rate.is_some_and(|r| r <= 5000.0));
    (model, queue)
}

/// Submits the 5th batch, which the model holds at its gate, and waits until it is held.
fn hold_next(model: &Lengths, queue: &BatchQueue<Arc<Lengths>>) -> Handle<u64> {
    let h = queue.submit((99, 100)).unwrap();
    assert!(model.gate.wait_entered(1));
    h
}

#[test]
fn the_queue_refuses_only_past_its_wait_bound() {
    let bound = Duration::from_millis(100);
    let (model, queue) = slow_queue(Some(bound));
    let held = hold_next(&model, &queue);
    // Singles of 100 tokens behind the held batch: the first is always admitted (nothing
    // waits); once 600 tokens wait the estimate is at least 120 ms, past the bound.
    let mut admitted = Vec::new();
    let mut refusals = Vec::new();
    for t in 0..10u64 {
        match queue.submit((t, 100)) {
            Ok(h) => {
                assert!(
                    refusals.is_empty(),
                    "admitted after a refusal with nothing run"
                );
                admitted.push((t, h));
            }
            Err(e) => refusals.push(e),
        }
    }
    assert!(
        (1..=6).contains(&admitted.len()),
        "{} admitted",
        admitted.len()
    );
    for e in &refusals {
        match e {
            BatchError::QueueFull {
                reason: Overload::Wait { estimated, limit },
                retry_after,
            } => {
                assert_eq!(*limit, bound);
                assert!(estimated > limit);
                // The excess over the bound, what must drain first (at least 1 ms).
                let excess = (*estimated - *limit).max(Duration::from_millis(1));
                assert_eq!(*retry_after, excess);
            }
            other => panic!("expected a wait refusal, got {other:?}"),
        }
    }
    model.gate.open();
    assert_eq!(answer(held), Ok(199));
    for (t, h) in admitted {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
}

#[test]
fn a_deadline_refuses_only_when_the_estimate_exceeds_it() {
    let (model, queue) = slow_queue(None);
    let held = hold_next(&model, &queue);
    // 1,000 tokens wait: at most 5,000 tokens/s, so at least 200 ms ahead.
    let waiting: Vec<_> = (0..10u64)
        .map(|t| queue.submit((t, 100)).unwrap())
        .collect();
    let soon = Instant::now() + Duration::from_millis(50);
    let refused = queue.submit_group_with_deadline(vec![(20, 100), (21, 100)], soon);
    let Err(BatchError::QueueFull {
        reason: Overload::Wait { estimated, limit },
        retry_after,
    }) = refused
    else {
        panic!("expected a wait refusal, got {refused:?}");
    };
    assert!(estimated >= Duration::from_millis(200), "{estimated:?}");
    assert!(limit <= Duration::from_millis(50));
    assert!(retry_after >= Duration::from_millis(150));
    // A deadline far enough away is admitted; one already passed is admitted and expires
    // (refusing it would tell the caller to retry what cannot succeed).
    let later = queue
        .submit_with_deadline((22, 100), Instant::now() + HANG_GUARD)
        .unwrap();
    let late = queue
        .submit_with_deadline((23, 100), Instant::now())
        .unwrap();
    model.gate.open();
    assert_eq!(answer(held), Ok(199));
    for (t, h) in (0u64..).zip(waiting) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    assert_eq!(answer(later), Ok(45));
    assert_eq!(answer(late), Err(BatchError::DeadlineExceeded));
}

#[test]
fn replicas_route_groups_whole_and_refuse_when_every_replica_is_full() {
    let models: Vec<Arc<Tagger>> = (0..2)
        .map(|_| Arc::new(Tagger::gated(usize::MAX)))
        .collect();
    let config = BatchConfig {
        max_queue: 1,
        ..one_worker(1)
    };
    let replicas = Replicas::new(
        models
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("r{i}"), m.clone())),
        config,
    )
    .unwrap();
    let a = replicas.submit_group(vec![1, 2, 3]).unwrap();
    let b = replicas.submit_group(vec![4, 5]).unwrap();
    let mut routed: Vec<u64> = replicas.stats().iter().map(|r| r.routed).collect();
    routed.sort_unstable();
    assert_eq!(routed, vec![2, 3], "each group went whole to one replica");
    // Each replica holds one request in its queue (its worker took at most one input).
    for i in 0..2 {
        let q = replicas.replica(i).unwrap();
        assert!(eventually(
            || q.queue_len() + 1 == q.stats().submitted as usize
        ));
    }
    let refused = replicas.submit_group(vec![6, 7]);
    assert!(
        matches!(
            refused,
            Err(BatchError::QueueFull {
                reason: Overload::Requests { capacity: 1 },
                ..
            })
        ),
        "{refused:?}"
    );
    for m in &models {
        m.gate.open();
    }
    let outs: Vec<u64> = a.into_iter().chain(b).map(|h| answer(h).unwrap()).collect();
    assert_eq!(outs, vec![3, 5, 7, 9, 11]);
}
