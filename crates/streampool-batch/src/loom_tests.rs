//! loom models of the submit / take / answer hand-off: the real [`Shared::submit`],
//! [`Shared::serve`] (bounded queue + batch forming) and one-shot answer slot, driven by
//! loom threads over every interleaving (bounded preemptions). Each model checks that every
//! submitted request gets exactly one answer, that it is its own, and that the model ran
//! exactly the requests answered with an output. The `loom_pipelined_*` models do the same
//! for a worker split into its preparing and running stages ([`Shared::serve_preparing`],
//! [`Shared::serve_running`]) around the real [`Handoff`], including the preparing stage's
//! hold on its runner (`loom_pipelined_hold_wakes_when_the_runner_is_idle`); the group
//! models check that a group of inputs is admitted whole and each input answered to its own
//! handle.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release -p streampool-batch --lib loom`.
//! A timed wait under loom releases its lock, lets other threads run, and then times out (see
//! `streampool::sync::Condvar::wait_timeout`): the batch window closes after one round of
//! other threads, and a caller with a deadline gives up after one round unless a worker
//! claimed its request meanwhile; both are legal schedules of the real code.

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use loom::thread;
use streampool::sync::Arc;

use crate::handoff::Handoff;
use crate::shared::Shared;
use crate::{BatchConfig, BatchContext, BatchError, BatchModel, ModelError};

/// Answers `x` with `10 * x + 1` and records what it ran. The record uses a std mutex on
/// purpose: it is test bookkeeping, not part of the hand-off, and would only add states.
#[derive(Default)]
struct Tagger {
    ran: StdMutex<Vec<u32>>,
}

impl BatchModel for Tagger {
    type Input = u32;
    type Output = u32;
    fn forward_batch(&self, xs: Vec<u32>, _: &BatchContext) -> Result<Vec<u32>, ModelError> {
        self.ran.lock().unwrap().extend(&xs);
        Ok(xs.into_iter().map(|x| 10 * x + 1).collect())
    }
}

fn config(max_batch_size: usize, max_queue: usize, workers: usize) -> BatchConfig {
    BatchConfig {
        max_batch_size,
        // Never reached in real time: loom replays schedules and needs the model to be
        // deterministic, so whether a window ends must not depend on the clock (a short
        // window that sometimes expired while loom explored broke its replay). Windows end
        // through the loom timed wait, which always times out.
        max_wait: Duration::from_secs(3600),
        max_queue,
        workers,
        ..BatchConfig::default()
    }
}

fn shared(config: BatchConfig) -> (Arc<Shared<Tagger>>, Arc<Tagger>) {
    let model = Arc::new(Tagger::default());
    (Arc::new(Shared::new(model.clone(), config).unwrap()), model)
}

fn builder() -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    // Every bug of this hand-off needs at most a couple of preemptions; the bound keeps the
    // four-thread models to seconds.
    if b.preemption_bound.is_none() {
        b.preemption_bound = Some(3);
    }
    b
}

fn spawn_workers(s: &Arc<Shared<Tagger>>, n: usize) -> Vec<thread::JoinHandle<()>> {
    (0..n)
        .map(|w| {
            let s = s.clone();
            thread::spawn(move || s.serve(w))
        })
        .collect()
}

fn ran_sorted(model: &Tagger) -> Vec<u32> {
    let mut ran = model.ran.lock().unwrap().clone();
    ran.sort_unstable();
    ran
}

/// Two callers, one worker batching up to two: each caller gets its own answer, once.
#[test]
fn loom_two_callers_one_worker() {
    builder().check(|| {
        let (s, model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        let callers: Vec<_> = (0..2u32)
            .map(|i| {
                let s = s.clone();
                thread::spawn(move || s.submit(i, None).unwrap().wait())
            })
            .collect();
        for (i, c) in (0u32..).zip(callers) {
            assert_eq!(c.join().unwrap(), Ok(10 * i + 1));
        }
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(ran_sorted(&model), vec![0, 1]);
        assert_eq!(s.stats.snapshot(Default::default(), None).completed, 2);
        // Every request's cost was settled exactly once (the router's load figure).
        assert_eq!(s.outstanding(), 0);
    });
}

/// One caller, two workers taking single-request batches: the forming hand-off between
/// workers neither loses nor duplicates the request.
#[test]
fn loom_one_caller_two_workers() {
    builder().check(|| {
        let (s, model) = shared(config(1, 4, 2));
        let workers = spawn_workers(&s, 2);
        let answers: Vec<_> = (0..2u32)
            .map(|i| s.submit(i, None).unwrap())
            .map(|h| h.wait())
            .collect();
        assert_eq!(answers, vec![Ok(1), Ok(11)]);
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(ran_sorted(&model), vec![0, 1]);
    });
}

/// A caller whose deadline passes races the worker's claim: it is answered either its own
/// output (and ran) or `DeadlineExceeded` (and never ran), never both, never neither.
#[test]
fn loom_deadline_races_claim() {
    builder().check(|| {
        let (s, model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        let late = {
            let s = s.clone();
            thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(3600);
                s.submit(7, Some(deadline)).unwrap().wait()
            })
        };
        let plain = s.submit(3, None).unwrap().wait();
        let late = late.join().unwrap();
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(plain, Ok(31));
        let ran = ran_sorted(&model);
        match late {
            Ok(v) => {
                assert_eq!(v, 71);
                assert_eq!(ran, vec![3, 7]);
            }
            Err(e) => {
                assert_eq!(e, BatchError::DeadlineExceeded);
                assert_eq!(ran, vec![3]);
                assert_eq!(s.stats.snapshot(Default::default(), None).expired, 1);
            }
        }
        assert_eq!(s.outstanding(), 0, "an expired request is settled too");
    });
}

/// Shutdown without draining races a submit: the caller gets exactly one outcome, and an
/// output only if the model ran its request.
#[test]
fn loom_shutdown_races_submit() {
    builder().check(|| {
        let (s, model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        let caller = {
            let s = s.clone();
            thread::spawn(move || s.submit(5, None).and_then(|h| h.wait()))
        };
        s.close(false);
        let answer = caller.join().unwrap();
        workers.into_iter().for_each(|w| w.join().unwrap());
        let ran = ran_sorted(&model);
        match answer {
            Ok(v) => {
                assert_eq!(v, 51);
                assert_eq!(ran, vec![5]);
            }
            Err(e) => {
                assert_eq!(e, BatchError::ShutDown);
                assert!(ran.is_empty());
            }
        }
        assert_eq!(
            s.outstanding(),
            0,
            "refused, shut down or run: settled once"
        );
    });
}

/// A caller that drops its handle races the worker: the request runs at most once and is
/// counted exactly once, as completed or as cancelled.
#[test]
fn loom_abandoned_handle() {
    builder().check(|| {
        let (s, model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        drop(s.submit(9, None).unwrap());
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        let stats = s.stats.snapshot(Default::default(), None);
        assert_eq!(stats.completed + stats.cancelled, 1);
        assert_eq!(model.ran.lock().unwrap().len() as u64, stats.completed);
        assert_eq!(s.outstanding(), 0, "a cancelled request is settled too");
    });
}

/// A group of two and a single from another thread, one worker batching up to two: every
/// input of the group and the single get their own answer, once, and the group counted as
/// one request while it waited.
#[test]
fn loom_group_and_single() {
    builder().check(|| {
        let (s, model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        let single = {
            let s = s.clone();
            thread::spawn(move || s.submit(9, None).unwrap().wait())
        };
        let group = s.submit_group(vec![1, 2], None).unwrap();
        let answers: Vec<_> = group.into_iter().map(|h| h.wait()).collect();
        assert_eq!(answers, vec![Ok(11), Ok(21)]);
        assert_eq!(single.join().unwrap(), Ok(91));
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        assert_eq!(ran_sorted(&model), vec![1, 2, 9]);
        assert_eq!(
            s.queue.load(),
            Default::default(),
            "every group left the count"
        );
        assert_eq!(s.outstanding(), 0);
    });
}

/// A group refused by a full queue races a worker draining it: the group is queued whole
/// or refused whole (its inputs given back), never split.
#[test]
fn loom_group_all_or_none() {
    builder().check(|| {
        let (s, model) = shared(config(1, 1, 1));
        let workers = spawn_workers(&s, 1);
        let first = s.submit(0, None).unwrap();
        let group = s.try_submit_group(vec![1, 2], None);
        let ran_group = match group {
            Ok(handles) => {
                let answers: Vec<_> = handles.into_iter().map(|h| h.wait()).collect();
                assert_eq!(answers, vec![Ok(11), Ok(21)]);
                true
            }
            Err(refused) => {
                assert!(matches!(refused.error, BatchError::QueueFull { .. }));
                assert_eq!(refused.inputs, Some(vec![1, 2]));
                false
            }
        };
        assert_eq!(first.wait(), Ok(1));
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
        let want = if ran_group { vec![0, 1, 2] } else { vec![0] };
        assert_eq!(ran_sorted(&model), want);
        assert_eq!(s.outstanding(), 0);
    });
}

/// The async path: a future polled by loom's executor is woken by the worker's answer.
#[test]
fn loom_async_wait() {
    builder().check(|| {
        let (s, _model) = shared(config(2, 4, 1));
        let workers = spawn_workers(&s, 1);
        let caller = {
            let s = s.clone();
            thread::spawn(move || loom::future::block_on(s.submit(2, None).unwrap()))
        };
        assert_eq!(caller.join().unwrap(), Ok(21));
        s.close(true);
        workers.into_iter().for_each(|w| w.join().unwrap());
    });
}

/// [`Tagger`] with a preparation step (the trait's default `prepare_batch` and
/// `forward_prepared`), so workers run as a preparing and a running stage.
#[derive(Default)]
struct Staged(Tagger);

impl BatchModel for Staged {
    type Input = u32;
    type Output = u32;
    fn forward_batch(&self, xs: Vec<u32>, ctx: &BatchContext) -> Result<Vec<u32>, ModelError> {
        self.0.forward_batch(xs, ctx)
    }
    fn prepares(&self) -> bool {
        true
    }
}

/// One pipelined worker (its two stages as loom threads, joined by the real hand-off).
fn spawn_pipelined(s: &Arc<Shared<Staged>>) -> Vec<thread::JoinHandle<()>> {
    let handoff = Arc::new(Handoff::new());
    let (sp, hp) = (s.clone(), handoff.clone());
    let (sr, hr) = (s.clone(), handoff);
    vec![
        thread::spawn(move || sp.serve_preparing(0, &hp)),
        thread::spawn(move || sr.serve_running(0, &hr)),
    ]
}

fn staged(config: BatchConfig) -> (Arc<Shared<Staged>>, Arc<Staged>) {
    let model = Arc::new(Staged::default());
    (Arc::new(Shared::new(model.clone(), config).unwrap()), model)
}

/// Two requests through a pipelined worker batching one at a time, so one batch can be
/// prepared while the other runs, and a graceful shutdown right after submitting: each gets
/// its own answer once, the model ran each request once, and every cost was settled. (Fails
/// if the runner stops at the hand-off's close with a batch still in it.) (The caller is the main thread: with two stages and a
/// second caller thread the model did not finish in minutes.)
#[test]
fn loom_pipelined_worker() {
    builder().check(|| {
        let (s, model) = staged(config(1, 4, 1));
        let stages = spawn_pipelined(&s);
        let first = s.submit(0, None).unwrap();
        let second = s.submit(1, None).unwrap();
        // A graceful shutdown at once: the preparer may finish the hand-off while the last
        // batch still waits in it, and that batch must still run.
        s.close(true);
        assert_eq!(first.wait(), Ok(1));
        assert_eq!(second.wait(), Ok(11));
        stages.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(ran_sorted(&model.0), vec![0, 1]);
        let stats = s.stats.snapshot(Default::default(), None);
        assert_eq!(stats.completed, 2);
        assert_eq!(stats.prepared_batches, stats.batches);
        assert_eq!(s.outstanding(), 0);
    });
}

/// The preparing stage holds a partial batch while its runner is busy and no lead time is
/// known yet: only the runner going idle can wake it. Both requests must be answered
/// before the queue is closed (the close would wake it too), so a lost wake-up of the
/// runner's `finished` shows as a deadlock.
#[test]
fn loom_pipelined_hold_wakes_when_the_runner_is_idle() {
    builder().check(|| {
        let (s, model) = staged(config(2, 4, 1));
        let stages = spawn_pipelined(&s);
        let first = s.submit(0, None).unwrap();
        let second = s.submit(1, None).unwrap();
        assert_eq!(first.wait(), Ok(1));
        assert_eq!(second.wait(), Ok(11));
        s.close(true);
        stages.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(ran_sorted(&model.0), vec![0, 1]);
        assert_eq!(s.outstanding(), 0);
    });
}

/// Shutdown without draining races a request through the pipeline: one outcome, an output
/// only if the model ran it.
#[test]
fn loom_pipelined_shutdown_now() {
    builder().check(|| {
        let (s, model) = staged(config(1, 4, 1));
        let stages = spawn_pipelined(&s);
        let caller = {
            let s = s.clone();
            thread::spawn(move || s.submit(5, None).and_then(|h| h.wait()))
        };
        s.close(false);
        let answer = caller.join().unwrap();
        stages.into_iter().for_each(|t| t.join().unwrap());
        match answer {
            Ok(v) => {
                assert_eq!(v, 51);
                assert_eq!(ran_sorted(&model.0), vec![5]);
            }
            Err(e) => {
                assert_eq!(e, BatchError::ShutDown);
                assert!(ran_sorted(&model.0).is_empty());
            }
        }
        assert_eq!(s.outstanding(), 0);
    });
}

/// The running stage is gone (its hand-off closed) while the preparing stage works: the
/// request is still answered exactly once (`ShutDown`, from the dropped prepared batch or
/// from the queue's close), never run, and settled.
#[test]
fn loom_pipelined_runner_gone() {
    builder().check(|| {
        let (s, model) = staged(config(1, 4, 1));
        let handoff = Arc::new(Handoff::new());
        let preparer = {
            let (s, h) = (s.clone(), handoff.clone());
            thread::spawn(move || s.serve_preparing(0, &h))
        };
        let handle = s.submit(3, None).unwrap();
        if let Some(left) = handoff.close() {
            // What the running stage's drop guard does with a batch left in the slot.
            s.drop_ready(left);
        }
        preparer.join().unwrap();
        s.close(false);
        assert_eq!(handle.wait(), Err(BatchError::ShutDown));
        assert!(ran_sorted(&model.0).is_empty());
        assert_eq!(s.outstanding(), 0);
    });
}

/// The device scheduler's turn-taking: with one slot, two normal queues' batches never run
/// at once, and both get their turn (no lost wake-up, whichever order they come in).
#[test]
fn loom_scheduler_one_slot_excludes_and_wakes() {
    use crate::{DeviceScheduler, Priority};
    use streampool::sync::{AtomicUsize, Ordering};
    builder().check(|| {
        let sched = DeviceScheduler::new(1);
        let in_flight = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..2)
            .map(|_| {
                let share = sched.share(Priority::Normal, 1);
                let in_flight = in_flight.clone();
                thread::spawn(move || {
                    let _turn = share.turn(8);
                    assert_eq!(in_flight.fetch_add(1, Ordering::SeqCst), 0);
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(sched.stats().granted, [0, 2, 0]);
        assert_eq!(sched.stats().running, 0);
    });
}

/// A high-class batch starts while the only slot is held; a low one waiting for that slot
/// is woken once it is given back.
#[test]
fn loom_scheduler_high_never_waits_and_low_is_woken() {
    use crate::{DeviceScheduler, Priority};
    builder().check(|| {
        let sched = DeviceScheduler::new(1);
        let normal = sched.share(Priority::Normal, 1);
        let held = normal.turn(8);
        let high = {
            let share = sched.share(Priority::High, 1);
            thread::spawn(move || drop(share.turn(8)))
        };
        let low = {
            let share = sched.share(Priority::Low, 1);
            thread::spawn(move || drop(share.turn(8)))
        };
        high.join().unwrap();
        drop(held);
        low.join().unwrap();
        assert_eq!(sched.stats().granted, [1, 1, 1]);
        assert_eq!(sched.stats().running, 0);
    });
}
