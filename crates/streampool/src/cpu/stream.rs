//! A CPU stream: a worker thread draining an in-order job queue.

use std::any::Any;
use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kernels;
use super::progress::Progress;
use crate::backend::{BackendEvent, BackendStream, DevicePtr};
use crate::kernel::{Activation, Kernel};
use crate::sync::{Arc, Condvar, Mutex};
use crate::{Error, Result};

/// One unit of a stream's queue. Kernels travel by value: a launch, the per-op path, then
/// allocates no job box (a `Box<dyn FnOnce>` per op showed in the per-op profile).
enum Job {
    /// Runs `kernels::run` on it. Its pointers are valid until it has run (the contract of
    /// [`BackendStream::launch`], which queued it).
    Kernel(Kernel),
    /// Anything else: copies, waits, timestamps.
    Call(Box<dyn FnOnce() + Send>),
}

impl Job {
    fn run(self) {
        match self {
            // SAFETY: `launch`'s caller guarantees every pointer stays valid until this runs.
            Job::Kernel(kernel) => {
                super::profile::timed(&kernel, || unsafe { kernels::run(&kernel) })
            }
            Job::Call(f) => f(),
        }
    }
}

/// What the worker and events share with the stream handle.
pub(crate) struct StreamShared {
    pub(crate) progress: Progress,
    /// First panic message of a job since the last synchronize (a deferred error, as in CUDA,
    /// but reported and cleared per stream so one bad op never poisons the device).
    fault: Mutex<Option<String>>,
}

/// Jobs handed from submitting threads to the worker.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<Job>,
    /// Jobs ever queued: the sequence number of the newest one.
    submitted: u64,
    /// The stream is shutting down: no new jobs; the worker exits once `jobs` is empty.
    closed: bool,
    /// The worker is parked on `JobQueue::ready` (so a submitter must wake it).
    idle: bool,
}

/// The hand-off between submitters and the worker. A plain mutex and condition variable
/// from the `sync` shim rather than a channel, so the whole hand-off is visible to loom and
/// ThreadSanitizer (crossbeam-channel parks through `std::sync::Mutex`, which TSan cannot
/// see here, and reported false races on every blocking `recv`).
#[derive(Default)]
struct JobQueue {
    /// Held only to push or take jobs and to number them (never while a job runs), so the
    /// sequence numbers events use match the order in which the worker runs jobs.
    state: Mutex<Queue>,
    /// Signalled when a job arrives for an idle worker, or the stream closes.
    ready: Condvar,
}

/// A stream of the CPU backend. Jobs run in submission order on one worker thread; the
/// submitting thread returns as soon as the job is queued.
pub(crate) struct CpuStream {
    name: String,
    queue: Arc<JobQueue>,
    shared: Arc<StreamShared>,
    worker: Option<JoinHandle<()>>,
}

impl CpuStream {
    pub(crate) fn new(name: String) -> Result<Self> {
        let queue = Arc::new(JobQueue::default());
        let shared = Arc::new(StreamShared {
            progress: Progress::new(),
            fault: Mutex::new(None),
        });
        let (worker_queue, worker_shared) = (queue.clone(), shared.clone());
        let worker = std::thread::Builder::new()
            .name(name.clone())
            .spawn(move || worker_loop(&worker_queue, &worker_shared))
            .map_err(|e| Error::Backend {
                device: "cpu".into(),
                msg: format!("spawning {name}: {e}"),
            })?;
        Ok(Self {
            name,
            queue,
            shared,
            worker: Some(worker),
        })
    }

    /// Queues `job`; returns its sequence number (the event value that covers it).
    fn enqueue(&self, job: Job) -> Result<u64> {
        let (seq, wake) = {
            let mut q = self.queue.state.lock();
            if q.closed {
                return Err(self.closed());
            }
            q.jobs.push_back(job);
            q.submitted += 1;
            (q.submitted, std::mem::take(&mut q.idle))
        };
        if wake {
            // After unlocking: the worker parked while holding the lock, so it is waiting
            // by now and cannot miss this.
            self.queue.ready.notify_all();
        }
        Ok(seq)
    }

    fn submitted(&self) -> u64 {
        self.queue.state.lock().submitted
    }

    fn closed(&self) -> Error {
        Error::Backend {
            device: "cpu".into(),
            msg: format!("{} is shut down", self.name),
        }
    }

    fn take_fault(&self) -> Result<()> {
        match self.shared.fault.lock().take() {
            Some(msg) => Err(Error::Backend {
                device: "cpu".into(),
                msg: format!("{}: {msg}", self.name),
            }),
            None => Ok(()),
        }
    }
}

fn worker_loop(queue: &JobQueue, shared: &StreamShared) {
    // Jobs are taken in batches: one lock round-trip per batch, not per job.
    let mut batch = VecDeque::new();
    loop {
        {
            let mut q = queue.state.lock();
            while q.jobs.is_empty() {
                if q.closed {
                    return;
                }
                q.idle = true;
                q = queue.ready.wait(q);
            }
            std::mem::swap(&mut q.jobs, &mut batch);
        }
        for job in batch.drain(..) {
            if let Err(panic) = catch_unwind(AssertUnwindSafe(|| job.run())) {
                let msg = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "kernel panicked".into());
                tracing::error!(%msg, "cpu stream job failed");
                shared.fault.lock().get_or_insert(msg);
            }
            shared.progress.advance();
        }
    }
}

impl Drop for CpuStream {
    fn drop(&mut self) {
        // Closing lets the worker finish what is queued and exit; joining keeps queued jobs
        // from outliving the memory the device is about to release.
        self.queue.state.lock().closed = true;
        self.queue.ready.notify_all();
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

/// An event of the CPU backend: "the stream has completed `seq` jobs".
pub(crate) struct CpuEvent {
    shared: Arc<StreamShared>,
    seq: u64,
    time: Option<Arc<Mutex<Option<Instant>>>>,
}

impl CpuEvent {
    fn same_stream(&self, shared: &Arc<StreamShared>) -> bool {
        Arc::ptr_eq(&self.shared, shared)
    }
}

impl BackendEvent for CpuEvent {
    fn query(&self) -> bool {
        self.shared.progress.completed() >= self.seq
    }
    fn synchronize(&self) -> Result<()> {
        self.shared.progress.wait_for(self.seq);
        Ok(())
    }
    fn elapsed_since(&self, earlier: &dyn BackendEvent) -> Result<Duration> {
        let earlier = earlier.as_any().downcast_ref::<CpuEvent>().ok_or_else(|| {
            Error::InvalidArgument("elapsed: events of different backends".into())
        })?;
        self.synchronize()?;
        earlier.synchronize()?;
        let stamp = |e: &CpuEvent| {
            e.time.as_ref().and_then(|t| *t.lock()).ok_or_else(|| {
                Error::InvalidArgument("elapsed: event was not recorded with timing".into())
            })
        };
        let (a, b) = (stamp(earlier)?, stamp(self)?);
        Ok(b.saturating_duration_since(a))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// Carries a device address into a job. The unsafe contract of the launching call (the
/// memory stays valid and un-reused until the job has run) is what makes the move sound.
#[derive(Clone, Copy)]
struct SendPtr(u64);

impl BackendStream for CpuStream {
    fn fuses_matmul_bias(&self) -> bool {
        true // the bias rows are added right after the product, while they are in cache
    }

    fn fuses_matmul_act(&self, _act: Activation) -> bool {
        true // applied right after the bias, as the bias kernel would
    }

    fn prepacks_matmul_weights(&self) -> bool {
        true // packed into the GEMM's panels once, not on every call (kernels::sgemm)
    }

    fn record(&self, timing: bool) -> Result<Arc<dyn BackendEvent>> {
        if timing {
            let cell = Arc::new(Mutex::new(None));
            let stamp = cell.clone();
            let seq = self.enqueue(Job::Call(Box::new(move || {
                *stamp.lock() = Some(Instant::now())
            })))?;
            Ok(Arc::new(CpuEvent {
                shared: self.shared.clone(),
                seq,
                time: Some(cell),
            }))
        } else {
            Ok(Arc::new(CpuEvent {
                shared: self.shared.clone(),
                seq: self.submitted(),
                time: None,
            }))
        }
    }

    fn wait(&self, event: &Arc<dyn BackendEvent>) -> Result<()> {
        let event = event
            .as_any()
            .downcast_ref::<CpuEvent>()
            .ok_or_else(|| Error::InvalidArgument("wait_event: event of another backend".into()))?;
        // Same stream: already ordered. Completed: nothing to wait for.
        if event.same_stream(&self.shared) || event.query() {
            return Ok(());
        }
        let (shared, seq) = (event.shared.clone(), event.seq);
        self.enqueue(Job::Call(Box::new(move || shared.progress.wait_for(seq))))?;
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        self.shared.progress.wait_for(self.submitted());
        self.take_fault()
    }

    unsafe fn launch(&self, kernel: Kernel) -> Result<()> {
        // The caller guarantees every pointer stays valid until the job has run (`Job::run`).
        self.enqueue(Job::Kernel(kernel))?;
        Ok(())
    }

    unsafe fn copy_from_host(&self, src: Vec<u8>, dst: DevicePtr) -> Result<()> {
        let dst = SendPtr(dst.0);
        self.enqueue(Job::Call(Box::new(move || {
            let dst = dst;
            // SAFETY: the caller guarantees `dst` is valid for `src.len()` bytes until this runs.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst.0 as *mut u8, src.len()) }
        })))?;
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        let (src, out, len) = (SendPtr(src.0), SendPtr(dst.as_mut_ptr() as u64), dst.len());
        let seq = self.enqueue(Job::Call(Box::new(move || {
            let (src, out) = (src, out);
            // SAFETY: `src` is valid per the caller; `out` is the caller's buffer, which stays
            // borrowed because this function blocks below until the job has run.
            unsafe { std::ptr::copy_nonoverlapping(src.0 as *const u8, out.0 as *mut u8, len) }
        })))?;
        self.shared.progress.wait_for(seq);
        self.take_fault()
    }
}
