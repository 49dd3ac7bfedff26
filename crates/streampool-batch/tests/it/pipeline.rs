//! BatchQueue with a model that has a preparation step (`BatchModel::prepares`): each worker
//! is a preparing and a running thread joined by a one-batch hand-off. The queue's guarantees
//! (every request answered once, to its caller; deadlines; backpressure; shutdown) hold, and
//! preparation really overlaps the running batch.

use std::thread::ThreadId;
use std::time::{Duration, Instant};

use crate::util::{eventually, Gate};
use parking_lot::Mutex;
use streampool_batch::{
    BatchConfig, BatchContext, BatchError, BatchModel, BatchQueue, ModelError, Overload, Prepared,
};

/// What one stage did with one batch: its thread, its tags and when.
#[derive(Debug, Clone)]
struct Span {
    thread: ThreadId,
    name: Option<String>,
    tags: Vec<u64>,
    start: Instant,
    end: Instant,
}

impl Span {
    fn overlaps(&self, other: &Span) -> bool {
        self.start < other.end && other.start < self.end
    }
}

/// Prepares tag `t` into `(t, 3 t)` and answers `2 t + 1` after checking the prepared value,
/// recording every stage's span. Its first `gated` forwards wait on `gate`; preparing a
/// batch holding `fail_on` errors, holding `panic_on` panics.
#[derive(Default)]
struct Staged {
    prep_sleep: Duration,
    run_sleep: Duration,
    gate: Gate,
    gated: usize,
    fail_on: Option<u64>,
    panic_on: Option<u64>,
    prepared: Mutex<Vec<Span>>,
    ran: Mutex<Vec<Span>>,
}

fn span(tags: Vec<u64>, start: Instant) -> Span {
    let me = std::thread::current();
    Span {
        thread: me.id(),
        name: me.name().map(str::to_string),
        tags,
        start,
        end: Instant::now(),
    }
}

impl Staged {
    fn prepared_tags(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .prepared
            .lock()
            .iter()
            .flat_map(|s| s.tags.clone())
            .collect();
        v.sort_unstable();
        v
    }

    fn ran_tags(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self
            .ran
            .lock()
            .iter()
            .flat_map(|s| s.tags.clone())
            .collect();
        v.sort_unstable();
        v
    }
}

impl BatchModel for Staged {
    type Input = u64;
    type Output = u64;

    fn forward_batch(&self, _: Vec<u64>, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
        Err("a pipelined model's batches go through forward_prepared".into())
    }

    fn prepares(&self) -> bool {
        true
    }

    fn prepare_batch(&self, tags: Vec<u64>, _: &BatchContext) -> Result<Prepared, ModelError> {
        let start = Instant::now();
        std::thread::sleep(self.prep_sleep);
        let has = |t: Option<u64>| t.is_some_and(|t| tags.contains(&t));
        if has(self.panic_on) {
            panic!("preparation exploded");
        }
        self.prepared.lock().push(span(tags.clone(), start));
        if has(self.fail_on) {
            return Err("preparation refused".into());
        }
        Ok(Prepared::new(
            tags.into_iter().map(|t| (t, 3 * t)).collect::<Vec<_>>(),
        ))
    }

    fn forward_prepared(&self, p: Prepared, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
        let start = Instant::now();
        let pairs = p.downcast::<Vec<(u64, u64)>>()?;
        let index = {
            let mut ran = self.ran.lock();
            ran.push(span(pairs.iter().map(|p| p.0).collect(), start));
            ran.len()
        };
        if index <= self.gated {
            assert!(self.gate.pass(), "gate never opened");
        }
        std::thread::sleep(self.run_sleep);
        if let Some(last) = self.ran.lock().get_mut(index - 1) {
            last.end = Instant::now();
        }
        pairs
            .into_iter()
            .map(|(t, three)| {
                if three == 3 * t {
                    Ok(2 * t + 1)
                } else {
                    Err(format!("tag {t} prepared as {three}").into())
                }
            })
            .collect()
    }
}

fn config(max_batch_size: usize, max_queue: usize, workers: usize) -> BatchConfig {
    BatchConfig {
        max_batch_size,
        max_queue,
        workers,
        ..BatchConfig::default()
    }
}

#[test]
fn every_request_is_answered_once_to_its_caller() {
    let queue = BatchQueue::new(Staged::default(), config(8, 64, 2)).unwrap();
    let (callers, each) = (16u64, 100u64);
    std::thread::scope(|s| {
        for c in 0..callers {
            let queue = &queue;
            s.spawn(move || {
                for i in 0..each {
                    let tag = c * 1000 + i;
                    assert_eq!(queue.infer(tag).unwrap(), 2 * tag + 1);
                }
            });
        }
    });
    let stats = queue.stats();
    assert_eq!(stats.completed, callers * each);
    assert_eq!((stats.failed, stats.expired, stats.shut_down), (0, 0, 0));
    assert_eq!(stats.prepared_batches, stats.batches);
    assert!(stats.prepare > Duration::ZERO);
    queue.shutdown();
    let model = queue.model();
    let mut want: Vec<u64> = (0..callers)
        .flat_map(|c| (0..each).map(move |i| c * 1000 + i))
        .collect();
    want.sort_unstable();
    assert_eq!(
        model.prepared_tags(),
        want,
        "each request prepared exactly once"
    );
    assert_eq!(model.ran_tags(), want, "each request run exactly once");
    // The two stages are distinct threads: preparing threads never run a batch.
    let prep_names: Vec<_> = model
        .prepared
        .lock()
        .iter()
        .map(|s| s.name.clone())
        .collect();
    let run_names: Vec<_> = model.ran.lock().iter().map(|s| s.name.clone()).collect();
    assert!(prep_names.iter().all(|n| n
        .as_deref()
        .is_some_and(|n| n.starts_with("streampool-prep-"))));
    assert!(run_names.iter().all(|n| n
        .as_deref()
        .is_some_and(|n| n.starts_with("streampool-batch-"))));
}

#[test]
fn preparation_of_the_next_batch_overlaps_the_running_one() {
    let model = Staged {
        prep_sleep: Duration::from_millis(15),
        run_sleep: Duration::from_millis(15),
        ..Staged::default()
    };
    // One worker, so any overlap is between its own two stages.
    let queue = BatchQueue::new(model, config(4, 64, 1)).unwrap();
    std::thread::scope(|s| {
        for c in 0..8u64 {
            let queue = &queue;
            s.spawn(move || {
                for i in 0..3 {
                    queue.infer(c * 10 + i).unwrap();
                }
            });
        }
    });
    queue.shutdown();
    let model = queue.model();
    let (prepared, ran) = (model.prepared.lock().clone(), model.ran.lock().clone());
    let overlapping = prepared
        .iter()
        .filter(|p| ran.iter().any(|r| r.overlaps(p) && r.thread != p.thread))
        .count();
    assert!(
        overlapping > 0,
        "no preparation overlapped a running batch ({} prepared, {} ran)",
        prepared.len(),
        ran.len()
    );
}

#[test]
fn a_failing_or_panicking_preparation_answers_its_batch_and_the_queue_goes_on() {
    let model = Staged {
        fail_on: Some(5),
        panic_on: Some(7),
        ..Staged::default()
    };
    let queue = BatchQueue::new(model, config(1, 16, 1)).unwrap();
    for t in 0..10u64 {
        let got = queue.infer(t);
        match t {
            5 => assert!(
                matches!(got, Err(BatchError::Model(m)) if m.to_string().contains("refused"))
            ),
            7 => assert!(
                matches!(got, Err(BatchError::Model(m)) if m.to_string().contains("exploded"))
            ),
            _ => assert_eq!(got, Ok(2 * t + 1)),
        }
    }
    let stats = queue.stats();
    assert_eq!((stats.completed, stats.failed), (8, 2));
    assert!(!queue.model().ran_tags().contains(&5));
    assert!(!queue.model().ran_tags().contains(&7));
}

/// Batch 1 is held in the model and batch 2 waits prepared in the hand-off: the preparing
/// stage takes nothing more from the queue, so a third request stays queued (its deadline
/// and the queue bound apply) and, once its deadline passes, is never prepared nor run.
#[test]
fn one_batch_ahead_at_most_deadlines_and_backpressure_hold() {
    let model = Staged {
        gated: 1,
        ..Staged::default()
    };
    let queue = BatchQueue::new(model, config(1, 2, 1)).unwrap();
    let first = queue.submit(1).unwrap();
    assert!(queue.model().gate.wait_entered(1));
    let second = queue.submit(2).unwrap();
    assert!(eventually(|| queue.model().prepared_tags() == vec![1, 2]));
    let late = queue
        .submit_with_deadline(3, Instant::now() + Duration::from_millis(30))
        .unwrap();
    let fourth = queue.submit(4).unwrap();
    // max_queue 2: requests 3 and 4 wait in the queue, the running and the prepared batch do
    // not count, so the next submit is refused at once.
    assert_eq!(queue.queue_len(), 2);
    assert!(matches!(
        queue.submit(5),
        Err(BatchError::QueueFull {
            reason: Overload::Requests { capacity: 2 },
            ..
        })
    ));
    assert_eq!(late.wait(), Err(BatchError::DeadlineExceeded));
    queue.model().gate.open();
    assert_eq!(first.wait(), Ok(3));
    assert_eq!(second.wait(), Ok(5));
    assert_eq!(fourth.wait(), Ok(9));
    queue.shutdown();
    assert_eq!(queue.model().prepared_tags(), vec![1, 2, 4]);
    assert_eq!(queue.model().ran_tags(), vec![1, 2, 4]);
    assert_eq!(queue.stats().expired, 1);
}

/// `shutdown_now` with one batch running, one prepared and one queued: the queued request
/// is answered `ShutDown` at once, the running and the prepared batch still finish.
#[test]
fn shutdown_now_finishes_the_running_and_prepared_batches() {
    let model = Staged {
        gated: 1,
        ..Staged::default()
    };
    let queue = BatchQueue::new(model, config(1, 8, 1)).unwrap();
    let first = queue.submit(1).unwrap();
    assert!(queue.model().gate.wait_entered(1));
    let second = queue.submit(2).unwrap();
    assert!(eventually(|| queue.model().prepared_tags() == vec![1, 2]));
    let third = queue.submit(3).unwrap();
    std::thread::scope(|s| {
        let stopper = s.spawn(|| queue.shutdown_now());
        assert_eq!(third.wait(), Err(BatchError::ShutDown));
        queue.model().gate.open();
        stopper.join().unwrap();
    });
    assert_eq!(first.wait(), Ok(3));
    assert_eq!(second.wait(), Ok(5));
    assert!(matches!(queue.submit(4), Err(BatchError::ShutDown)));
    assert_eq!(queue.outstanding(), 0);
}

/// A model that sets `prepares` and keeps the default `prepare_batch` / `forward_prepared`
/// gets its inputs through `forward_batch` unchanged.
#[test]
fn the_default_preparation_passes_inputs_through() {
    struct Doubler;
    impl BatchModel for Doubler {
        type Input = u64;
        type Output = u64;
        fn forward_batch(&self, xs: Vec<u64>, _: &BatchContext) -> Result<Vec<u64>, ModelError> {
            Ok(xs.into_iter().map(|x| 2 * x).collect())
        }
        fn prepares(&self) -> bool {
            true
        }
    }
    let queue = BatchQueue::new(Doubler, config(4, 64, 2)).unwrap();
    std::thread::scope(|s| {
        for i in 0..8u64 {
            let queue = &queue;
            s.spawn(move || assert_eq!(queue.infer(i).unwrap(), 2 * i));
        }
    });
    assert_eq!(queue.stats().prepared_batches, queue.stats().batches);
}

/// Many rounds of many callers with drops, deadlines and a final graceful shutdown through
/// the pipelined workers: every accepted request ends with exactly one outcome.
#[test]
fn stress_pipelined_hand_off() {
    for round in 0..20u64 {
        let queue = BatchQueue::new(Staged::default(), config(4, 16, 2)).unwrap();
        let answered = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for c in 0..8u64 {
                let (queue, answered) = (&queue, &answered);
                s.spawn(move || {
                    for i in 0..50u64 {
                        let tag = round * 100_000 + c * 1000 + i;
                        let outcome = match i % 5 {
                            // Dropped at once: run or skipped, never answered to anyone.
                            0 => {
                                if let Ok(h) = queue.submit(tag) {
                                    drop(h);
                                }
                                continue;
                            }
                            1 => queue.infer_with_deadline(tag, Instant::now()),
                            _ => queue.infer(tag),
                        };
                        match outcome {
                            Ok(v) => {
                                assert_eq!(v, 2 * tag + 1, "an answer went to the wrong caller")
                            }
                            Err(BatchError::DeadlineExceeded | BatchError::QueueFull { .. }) => {}
                            Err(e) => panic!("unexpected {e}"),
                        }
                        answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                });
            }
        });
        queue.shutdown();
        let st = queue.stats();
        assert_eq!(
            st.submitted,
            st.completed + st.expired + st.cancelled + st.failed + st.shut_down,
            "round {round}: every accepted request has exactly one outcome: {st:?}"
        );
        assert_eq!(st.failed, 0);
        assert_eq!(queue.outstanding(), 0);
    }
}
