//! BatchQueue behaviour: routing, batch forming, backpressure, deadlines, failures,
//! buckets, async, shutdown and stats. Models are host-only test models; gates hold a batch
//! inside the model so queue states are reached deterministically, never by timing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::util::{eventually, Tagger, HANG_GUARD};
use parking_lot::Mutex;
use streampool::Device;
use streampool_batch::{
    BatchConfig, BatchContext, BatchError, BatchModel, BatchQueue, Handle, ModelError, Overload,
};

fn config(max_batch_size: usize, max_queue: usize, workers: usize) -> BatchConfig {
    BatchConfig {
        max_batch_size,
        max_queue,
        workers,
        ..BatchConfig::default()
    }
}

/// Waits for a handle with the hang guard.
fn answer<O>(h: Handle<O>) -> Result<O, BatchError> {
    assert!(
        h.wait_timeout(HANG_GUARD),
        "no answer within the hang guard"
    );
    h.wait()
}

#[test]
fn results_return_to_the_right_caller_under_64_threads() {
    let model = Arc::new(Tagger::default());
    let queue = BatchQueue::new(model.clone(), config(16, 4096, 3)).unwrap();
    std::thread::scope(|s| {
        for t in 0..64u64 {
            let queue = &queue;
            s.spawn(move || {
                for j in 0..50u64 {
                    let tag = t * 1000 + j;
                    assert_eq!(queue.infer(tag).unwrap(), 2 * tag + 1);
                }
            });
        }
    });
    let stats = queue.stats();
    assert_eq!(stats.completed, 64 * 50);
    assert_eq!(stats.submitted, 64 * 50);
    assert!(stats.max_batch_seen() <= 16);
    let expected: Vec<u64> = (0..64u64)
        .flat_map(|t| (0..50).map(move |j| t * 1000 + j))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    assert_eq!(model.ran(), expected, "each request ran exactly once");
}

#[test]
fn batches_form_under_load_and_never_exceed_max() {
    // The first batch is held in the model until all 63 other requests wait in the queue,
    // so the following batches must take several requests each.
    let model = Arc::new(Tagger::gated(1));
    let queue = BatchQueue::new(model.clone(), config(8, 1024, 1)).unwrap();
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..64u64)
            .map(|tag| {
                let queue = &queue;
                s.spawn(move || queue.infer(tag))
            })
            .collect();
        assert!(model.gate.wait_entered(1));
        let first = model.batches.lock()[0].len();
        assert!(eventually(|| queue.queue_len() == 64 - first));
        model.gate.open();
        for (tag, h) in (0u64..).zip(handles) {
            assert_eq!(h.join().unwrap(), Ok(2 * tag + 1));
        }
    });
    let stats = queue.stats();
    assert!(
        stats.max_batch_seen() > 1,
        "histogram: {:?}",
        stats.batch_sizes
    );
    assert!(stats.max_batch_seen() <= 8);
    assert!(model.batches.lock().iter().all(|b| b.len() <= 8));
    let runs: usize = model.batches.lock().iter().map(Vec::len).sum();
    assert_eq!(runs, 64);
    assert_eq!(
        stats.batch_sizes.iter().sum::<u64>(),
        model.batches.lock().len() as u64
    );
}

#[test]
fn full_queue_rejects_at_once() {
    let model = Arc::new(Tagger::gated(1));
    let queue = BatchQueue::new(model.clone(), config(1, 2, 1)).unwrap();
    let a = queue.submit(1).unwrap();
    assert!(model.gate.wait_entered(1)); // `a` runs and is held; the queue is empty
    let b = queue.submit(2).unwrap();
    let c = queue.submit(3).unwrap();
    // Nothing has been measured yet, so the refusal suggests retrying in a second.
    let full = BatchError::QueueFull {
        reason: Overload::Requests { capacity: 2 },
        retry_after: Duration::from_secs(1),
    };
    assert_eq!(queue.submit(4).unwrap_err(), full);
    assert_eq!(queue.infer(5).unwrap_err(), full);
    model.gate.open();
    assert_eq!(answer(a), Ok(3));
    assert_eq!(answer(b), Ok(5));
    assert_eq!(answer(c), Ok(7));
    let stats = queue.stats();
    assert_eq!(stats.rejected, 2);
    assert_eq!(model.ran(), vec![1, 2, 3]);
}

#[test]
fn expired_requests_are_answered_and_never_run() {
    let model = Arc::new(Tagger::gated(1));
    let queue = BatchQueue::new(model.clone(), config(4, 16, 1)).unwrap();
    let a = queue.submit(1).unwrap();
    assert!(model.gate.wait_entered(1));
    // Expires while queued; its caller gives up at the deadline even though no worker is free.
    let b = queue
        .submit_with_deadline(2, Instant::now() + Duration::from_millis(20))
        .unwrap();
    // Already past its deadline: the worker answers it when dequeued.
    let c = queue.submit_with_deadline(3, Instant::now()).unwrap();
    let d = queue.submit(4).unwrap();
    assert_eq!(b.wait(), Err(BatchError::DeadlineExceeded));
    model.gate.open();
    assert_eq!(answer(a), Ok(3));
    assert_eq!(answer(c), Err(BatchError::DeadlineExceeded));
    assert_eq!(answer(d), Ok(9));
    assert_eq!(model.ran(), vec![1, 4]);
    assert!(eventually(|| queue.stats().expired == 2));
    // Through `infer_with_deadline` too.
    assert_eq!(
        queue.infer_with_deadline(5, Instant::now()),
        Err(BatchError::DeadlineExceeded)
    );
    assert_eq!(model.ran(), vec![1, 4]);
}

/// Holds the worker on a first request, queues `tags` behind it so they form one batch,
/// releases, and returns their answers.
fn run_as_one_batch(model: Tagger, tags: &[u64]) -> (Vec<Result<u64, BatchError>>, Arc<Tagger>) {
    let model = Arc::new(Tagger { gated: 1, ..model });
    let queue = BatchQueue::new(model.clone(), config(8, 64, 1)).unwrap();
    let first = queue.submit(100).unwrap();
    assert!(model.gate.wait_entered(1));
    let handles: Vec<_> = tags.iter().map(|&t| queue.submit(t).unwrap()).collect();
    model.gate.open();
    assert_eq!(answer(first), Ok(201));
    let answers = handles.into_iter().map(answer).collect();
    // The queue keeps serving after the failed batch.
    assert_eq!(queue.infer(50), Ok(101));
    assert_eq!(queue.infer(51), Ok(103));
    let stats = queue.stats();
    assert_eq!(stats.failed, tags.len() as u64);
    assert_eq!(stats.completed, 3);
    (answers, model)
}

fn assert_all_model_errors(answers: &[Result<u64, BatchError>], needle: &str) {
    assert_eq!(answers.len(), 3);
    for a in answers {
        match a {
            Err(BatchError::Model(msg)) => assert!(msg.to_string().contains(needle), "{msg}"),
            other => panic!("expected a model error, got {other:?}"),
        }
    }
}

#[test]
fn model_error_fails_its_whole_batch_and_the_queue_keeps_serving() {
    let model = Tagger {
        fail_on: Some(13),
        ..Tagger::default()
    };
    let (answers, model) = run_as_one_batch(model, &[12, 13, 14]);
    assert_all_model_errors(&answers, "tag refused");
    // Every caller gets the model's own error, with its type, not only its text.
    for a in &answers {
        let Err(BatchError::Model(failure)) = a else {
            unreachable!("checked above")
        };
        assert!(failure.downcast_ref::<std::io::Error>().is_some());
        assert!(!failure.is_panic());
    }
    assert!(model.batches.lock().contains(&vec![12, 13, 14]));
}

#[test]
fn model_panic_fails_its_whole_batch_and_the_queue_keeps_serving() {
    let model = Tagger {
        panic_on: Some(666),
        ..Tagger::default()
    };
    let (answers, _) = run_as_one_batch(model, &[665, 666, 667]);
    assert_all_model_errors(&answers, "tag exploded");
    assert!(answers
        .iter()
        .all(|a| matches!(a, Err(BatchError::Model(f)) if f.is_panic())));
}

#[test]
fn wrong_output_count_fails_its_whole_batch() {
    let model = Tagger {
        short_on: Some(99),
        ..Tagger::default()
    };
    let (answers, _) = run_as_one_batch(model, &[98, 99, 97]);
    assert_all_model_errors(&answers, "2 outputs for a batch of 3");
}

/// Token sequences; pads each input with zeros to the batch's bucket and returns
/// (padded length, masked sum) so callers can check both.
#[derive(Default)]
struct Padder {
    /// (padded_len, input lengths) of each batch.
    seen: Mutex<Vec<(usize, Vec<usize>)>>,
}

impl BatchModel for Padder {
    type Input = Vec<u32>;
    type Output = (usize, u64);

    fn input_len(&self, tokens: &Vec<u32>) -> usize {
        tokens.len()
    }

    fn forward_batch(
        &self,
        inputs: Vec<Vec<u32>>,
        ctx: &BatchContext,
    ) -> Result<Vec<(usize, u64)>, ModelError> {
        let len = ctx.padded_len.ok_or("buckets are configured")?;
        self.seen
            .lock()
            .push((len, inputs.iter().map(Vec::len).collect()));
        inputs
            .into_iter()
            .map(|tokens| {
                if tokens.len() > len {
                    return Err(format!("{} tokens do not fit bucket {len}", tokens.len()).into());
                }
                let mask: Vec<u64> = (0..len).map(|i| u64::from(i < tokens.len())).collect();
                let mut padded = tokens.clone();
                padded.resize(len, 0xdead);
                let sum = padded
                    .iter()
                    .zip(&mask)
                    .map(|(&t, &m)| u64::from(t) * m)
                    .sum();
                Ok((len, sum))
            })
            .collect()
    }
}

#[test]
fn variable_lengths_are_padded_to_the_smallest_fitting_bucket() {
    let model = Arc::new(Padder::default());
    let buckets = vec![4, 8, 16];
    let cfg = BatchConfig {
        buckets: buckets.clone(),
        ..config(8, 1024, 2)
    };
    let queue = BatchQueue::new(model.clone(), cfg).unwrap();
    let smallest = |len: usize| buckets.iter().copied().filter(|&b| b >= len).min().unwrap();
    std::thread::scope(|s| {
        for t in 0..16u32 {
            let queue = &queue;
            s.spawn(move || {
                for j in 0..20u32 {
                    let len = 1 + ((t * 7 + j * 3) % 16) as usize;
                    let tokens: Vec<u32> = (0..len as u32).map(|i| t * 100 + j + i).collect();
                    let expected: u64 = tokens.iter().map(|&x| u64::from(x)).sum();
                    assert_eq!(queue.infer(tokens).unwrap(), (smallest(len), expected));
                }
            });
        }
    });
    for (len, lens) in model.seen.lock().iter() {
        assert!(lens.iter().all(|&l| smallest(l) == *len), "{len}: {lens:?}");
    }
    assert_eq!(
        queue.infer(vec![0; 17]).unwrap_err(),
        BatchError::InputTooLong { len: 17, max: 16 }
    );
}

#[test]
fn async_api_under_a_multi_thread_tokio_runtime() {
    let model = Arc::new(Tagger::default());
    let queue = Arc::new(BatchQueue::new(model.clone(), config(8, 1024, 2)).unwrap());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for tag in 0..64u64 {
            let queue = queue.clone();
            tasks.spawn(async move { (tag, queue.infer_async(tag).await) });
        }
        let mut seen = HashSet::new();
        while let Some(done) = tokio::time::timeout(HANG_GUARD, tasks.join_next())
            .await
            .unwrap()
        {
            let (tag, out) = done.unwrap();
            assert_eq!(out, Ok(2 * tag + 1));
            seen.insert(tag);
        }
        assert_eq!(seen.len(), 64);
        let late = queue.submit_with_deadline(7, Instant::now()).unwrap().await;
        assert_eq!(late, Err(BatchError::DeadlineExceeded));
    });
}

#[test]
fn async_waiting_does_not_block_a_single_threaded_runtime() {
    // All 8 tasks run on one thread. Batches hold one request, and the model holds the
    // first until the other 7 requests are queued, which can only happen if awaiting the
    // first answer does not block the thread.
    let model = Arc::new(Tagger::gated(1));
    let queue = Arc::new(BatchQueue::new(model.clone(), config(1, 64, 1)).unwrap());
    let opener = {
        let (model, queue) = (model.clone(), queue.clone());
        std::thread::spawn(move || {
            let entered = model.gate.wait_entered(1);
            let queued = eventually(|| queue.queue_len() == 7);
            model.gate.open();
            entered && queued
        })
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for tag in 0..8u64 {
            let queue = queue.clone();
            tasks.spawn(async move { (tag, queue.infer_async(tag).await) });
        }
        while let Some(done) = tasks.join_next().await {
            let (tag, out) = done.unwrap();
            assert_eq!(out, Ok(2 * tag + 1));
        }
    });
    assert!(
        opener.join().unwrap(),
        "the other requests were never queued"
    );
    assert_eq!(model.batches.lock().len(), 8);
}

#[test]
fn graceful_shutdown_runs_and_answers_everything_queued() {
    let model = Arc::new(Tagger::gated(1));
    let queue = Arc::new(BatchQueue::new(model.clone(), config(4, 64, 1)).unwrap());
    let first = queue.submit(0).unwrap();
    assert!(model.gate.wait_entered(1));
    let queued: Vec<_> = (1..10u64).map(|t| queue.submit(t).unwrap()).collect();
    let closer = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.shutdown())
    };
    // Probe until the queue refuses; probes accepted before the close are run like the rest.
    let mut probes = Vec::new();
    assert!(eventually(|| match queue.submit(99) {
        Ok(h) => {
            probes.push(h);
            false
        }
        Err(e) => e == BatchError::ShutDown,
    }));
    assert!(
        queue.queue_len() >= 9,
        "the queued requests are still waiting"
    );
    model.gate.open();
    closer.join().unwrap();
    assert_eq!(answer(first), Ok(1));
    for (t, h) in (1u64..).zip(queued) {
        assert_eq!(answer(h), Ok(2 * t + 1));
    }
    for h in probes {
        assert_eq!(answer(h), Ok(199));
    }
    let ran: Vec<u64> = model.ran().into_iter().filter(|&t| t != 99).collect();
    assert_eq!(ran, (0..10).collect::<Vec<_>>());
}

#[test]
fn shutdown_now_answers_queued_requests_with_shut_down() {
    let model = Arc::new(Tagger::gated(1));
    let queue = Arc::new(BatchQueue::new(model.clone(), config(4, 64, 1)).unwrap());
    let first = queue.submit(0).unwrap();
    assert!(model.gate.wait_entered(1));
    let queued: Vec<_> = (1..6u64).map(|t| queue.submit(t).unwrap()).collect();
    let closer = {
        let queue = queue.clone();
        std::thread::spawn(move || queue.shutdown_now())
    };
    // Answered while the running batch is still held in the model.
    for h in queued {
        assert_eq!(answer(h), Err(BatchError::ShutDown));
    }
    model.gate.open();
    closer.join().unwrap();
    assert_eq!(answer(first), Ok(1));
    assert_eq!(queue.stats().shut_down, 5);
    assert_eq!(model.ran(), vec![0]);
    assert_eq!(queue.infer(1), Err(BatchError::ShutDown));
}

#[test]
fn dropping_the_queue_answers_every_handle() {
    let model = Arc::new(Tagger::default());
    let queue = BatchQueue::new(model.clone(), config(4, 256, 2)).unwrap();
    let handles: Vec<_> = (0..100u64).map(|t| queue.submit(t).unwrap()).collect();
    drop(queue);
    for (t, h) in (0u64..).zip(handles) {
        assert!(h.is_ready(), "answered before drop returned");
        assert_eq!(h.wait(), Ok(2 * t + 1));
    }
}

#[test]
fn dropped_handles_are_skipped_not_run() {
    let model = Arc::new(Tagger::gated(1));
    let queue = BatchQueue::new(model.clone(), config(4, 64, 1)).unwrap();
    let first = queue.submit(0).unwrap();
    assert!(model.gate.wait_entered(1));
    drop(queue.submit(1).unwrap());
    let kept = queue.submit(2).unwrap();
    model.gate.open();
    assert_eq!(answer(first), Ok(1));
    assert_eq!(answer(kept), Ok(5));
    assert_eq!(model.ran(), vec![0, 2]);
    assert!(eventually(|| queue.stats().cancelled == 1));
}

/// Records which stream each worker runs on, and holds every batch until all workers are
/// inside the model at once.
struct StreamProbe {
    workers: usize,
    device: Device,
    /// (worker, stream index, whether all workers were inside the model together).
    seen: Mutex<Vec<(usize, usize, bool)>>,
    entered: std::sync::atomic::AtomicUsize,
    gate: crate::util::Gate,
}

impl BatchModel for StreamProbe {
    type Input = u64;
    type Output = usize;

    fn forward_batch(&self, tags: Vec<u64>, ctx: &BatchContext) -> Result<Vec<usize>, ModelError> {
        let stream = self.device.current_stream()?.index();
        let inside = 1 + self
            .entered
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        if inside == self.workers {
            self.gate.open();
        }
        let together = self.gate.pass();
        self.seen.lock().push((ctx.worker, stream, together));
        Ok(vec![stream; tags.len()])
    }

    fn device(&self) -> Option<Device> {
        Some(self.device.clone())
    }
}

#[test]
fn each_worker_runs_on_its_own_stream_concurrently() {
    let workers = 4;
    let model = Arc::new(StreamProbe {
        workers,
        device: Device::cpu(),
        seen: Mutex::new(Vec::new()),
        entered: Default::default(),
        gate: crate::util::Gate::default(),
    });
    // One request per batch, so four batches must be inside the model at the same time for
    // the gate to open: batch N+1 forms and starts while batch N still runs.
    let queue = BatchQueue::new(model.clone(), config(1, 64, workers)).unwrap();
    let handles: Vec<_> = (0..workers as u64)
        .map(|t| queue.submit(t).unwrap())
        .collect();
    for h in handles {
        answer(h).unwrap();
    }
    let seen = model.seen.lock().clone();
    let streams: HashSet<usize> = seen.iter().map(|&(_, s, _)| s).collect();
    let ids: HashSet<usize> = seen.iter().map(|&(w, _, _)| w).collect();
    assert!(seen.iter().all(|&(_, _, together)| together), "{seen:?}");
    assert_eq!(ids.len(), workers, "{seen:?}");
    assert_eq!(streams.len(), workers, "{seen:?}");
    assert!(
        !streams.contains(&0),
        "workers use pooled streams, not the default one"
    );
}

#[test]
fn stats_report_counts_histogram_and_percentiles() {
    let model = Arc::new(Tagger::default());
    let queue = BatchQueue::new(model, config(8, 1024, 2)).unwrap();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let queue = &queue;
            s.spawn(move || (0..25).for_each(|j| assert!(queue.infer(t * 100 + j).is_ok())));
        }
    });
    let stats = queue.stats();
    assert_eq!(stats.completed, 200);
    let requests: u64 = (0u64..).zip(&stats.batch_sizes).map(|(n, &c)| n * c).sum();
    assert_eq!(requests, 200);
    assert_eq!(stats.latency.samples, 200);
    assert_eq!(stats.queue_wait.samples, 200);
    let l = stats.latency;
    assert!(l.p50_us <= l.p90_us && l.p90_us <= l.p99_us && l.p99_us <= l.max_us);
    assert!(l.p50_us > 0.0);
    let json = serde_json::to_value(&stats).unwrap();
    assert_eq!(json["completed"], 200);
    assert!(json["latency"]["p99_us"].is_number());
    queue.reset_stats();
    assert_eq!(queue.stats().completed, 0);
}

#[test]
fn invalid_configs_are_rejected() {
    for cfg in [config(0, 1, 1), config(1, 0, 1), config(1, 1, 0)] {
        assert!(matches!(
            BatchQueue::new(Tagger::default(), cfg),
            Err(BatchError::Config(_))
        ));
    }
}
