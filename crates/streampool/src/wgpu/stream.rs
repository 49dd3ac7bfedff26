//! A logical stream of the wgpu backend, and its events.
//!
//! A wgpu device has exactly one queue, so a stream is host-side: its own command encoder,
//! into which launches from its threads record compute passes, finished into command buffers
//! that are submitted to the one queue in the stream's order. The queue executes submissions
//! in submission order (WebGPU's queue timeline; wgpu inserts the barriers between them), so
//! work submitted after another stream's event was *submitted* runs after that event.
//!
//! **Events** are points in a stream's sequence of command buffers: "the first `seq` buffers
//! of this stream". Once those are submitted the event resolves to the submission that
//! covers them ([`Submitted`]: a `SubmissionIndex`, waited with `Device::poll`, and a flag set
//! by `Queue::on_submitted_work_done`, so `query` never blocks).
//!
//! **Barriers** hold back a stream's submissions: `Kernel::Sleep` (tests make a stream slow
//! on purpose; wgpu has no device-side sleep, so the stream's later command buffers are not
//! submitted before the time is up) and a wait on another stream's event that is not yet
//! submitted (the waiting stream submits its later buffers only after that event's buffers
//! are submitted). A barrier sits at a position in the buffer sequence and only holds back
//! buffers after it, so the waits form no cycle. `Stream::wait` does not rely on the single
//! queue for events of other devices' queues: those are not accepted (`Error::InvalidArgument`),
//! and with several queues a wait would have to host-wait on the submission (see `wait`).
//!
//! Locks: `state` is held to record a pass, finish or submit buffers (no GPU or host waits);
//! the device's quarantine lock, when on, is taken inside it around encoding and submission.

use std::any::Any;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::kernels::Pipelines;
use super::launch;
use super::profile::{self, StreamTimer};
use super::SharedRef;
use crate::backend::{BackendEvent, BackendStream, DevicePtr};
use crate::kernel::{Activation, Kernel};
use crate::sync::{Arc, AtomicBool, Mutex, Ordering};
use crate::{Error, Result};

/// Launches recorded into one encoder before it is finished and submitted on its own, so
/// the GPU starts on long chains without waiting for a synchronize.
const SUBMIT_EVERY: usize = 32;

/// With the ramp (`Shared::submit_ramp`), the first command buffer after a host wait is
/// submitted after this many launches, and each next one after twice as many, up to
/// [`SUBMIT_EVERY`]: the GPU starts after a few launches instead of idling while the host
/// records 32 (about 0.7 ms of a 3.5 ms MiniLM forward at batch 64 x 32 tokens on the H100,
/// `bench/results/wgpu-profile/`). The price: a call of 5 to 7 commands before its
/// read-back makes two submissions instead of one (finishing and submitting a command buffer
/// costs ~25-40 us of host time there, partly hidden behind the first one's GPU work); a
/// call of up to 4 (the MLP bench's upload, two launches and read-back copy) still makes one.
const SUBMIT_FIRST: usize = 4;

/// Launches the encoder takes before it is submitted, `finished` command buffers after the
/// stream's last host wait.
fn submit_after(ramp: bool, finished: u32) -> usize {
    if ramp {
        (SUBMIT_FIRST << finished.min(8)).min(SUBMIT_EVERY)
    } else {
        SUBMIT_EVERY
    }
}

/// One submission to the queue.
pub(crate) struct Submitted {
    index: wgpu::SubmissionIndex,
    /// Set by `on_submitted_work_done` (or after a wait): the work is done.
    done: Arc<AtomicBool>,
    /// When it was submitted: the timestamp of timed events (see `elapsed_since`).
    at: Instant,
}

/// What holds back a stream's later command buffers.
#[derive(Clone)]
struct Barrier {
    /// Unique within the stream, so a barrier lifted by two threads is removed once.
    id: u64,
    kind: BarrierKind,
}

#[derive(Clone)]
enum BarrierKind {
    /// Nothing after it is submitted before this instant (`Kernel::Sleep`).
    Until(Instant),
    /// Nothing after it is submitted before this event of another stream is submitted.
    After(Arc<WgpuEvent>),
}

#[derive(Default)]
struct State {
    encoder: Option<wgpu::CommandEncoder>,
    /// Launches in `encoder`.
    encoded: usize,
    /// Finished command buffers not yet submitted, numbered `submitted..finished`.
    held: VecDeque<wgpu::CommandBuffer>,
    finished: u64,
    submitted: u64,
    /// Barriers by position: `(p, b)` holds back buffers numbered `p` and later.
    barriers: VecDeque<(u64, Barrier)>,
    /// The newest submission of this stream.
    last: Option<Arc<Submitted>>,
    /// Barriers ever added (their ids).
    barrier_ids: u64,
    /// GPU timestamps of this stream's launches (the profile, `STREAMPOOL_WGPU_PROFILE=1`).
    timer: Option<StreamTimer>,
    /// Command buffers finished since this stream's last host wait (the submission ramp).
    since_wait: u32,
}

impl State {
    /// Adds a barrier before the next command buffer (the open encoder is finished first).
    fn push_barrier(&mut self, kind: BarrierKind) {
        self.barrier_ids += 1;
        let barrier = Barrier {
            id: self.barrier_ids,
            kind,
        };
        self.barriers.push_back((self.finished, barrier));
    }
}

/// The part of a stream its events point back to.
pub(crate) struct Core {
    shared: SharedRef,
    state: Mutex<State>,
    /// First error of an encoding or submission since the last synchronize (per stream, so
    /// one bad call never poisons the device).
    fault: Mutex<Option<String>>,
    /// Read-back staging buffers kept for reuse (unmapped, idle: a read-back takes one out
    /// for its whole copy-map-read-unmap, then puts it back). Held only to take or return
    /// a buffer, never across a GPU wait.
    readback: Mutex<Vec<wgpu::Buffer>>,
}

impl Drop for Core {
    fn drop(&mut self) {
        // The last owner of a core may be an event dropped inside a thread-local destructor,
        // where wgpu objects must not be torn down (see `SharedRef`): the kept buffers go
        // to a helper thread. (`get_mut`: no lock, the core is being dropped.)
        let kept = std::mem::take(self.readback.get_mut());
        if !kept.is_empty() {
            super::drop_off_thread(kept);
        }
    }
}

/// Read-back staging buffers are kept up to this size (larger reads get a buffer of their
/// own), and at most `READBACK_KEEP` of them per stream.
const READBACK_MAX: u64 = 1 << 20;
const READBACK_KEEP: usize = 4;

/// A stream of the wgpu backend.
pub(crate) struct WgpuStream {
    /// Both `Some` until dropped (taken by `drop`, see there).
    inner: Option<(Arc<Core>, Pipelines)>,
}

impl Drop for WgpuStream {
    fn drop(&mut self) {
        // Pooled streams are dropped from thread-local destructors (a thread's cached stream
        // holds the device), where wgpu objects must not be torn down.
        if let Some(inner) = self.inner.take() {
            super::drop_off_thread(inner);
        }
    }
}

impl WgpuStream {
    pub(crate) fn new(shared: SharedRef) -> Self {
        let timed = shared.timestamp_period.is_some();
        let core = Arc::new(Core {
            shared,
            state: Mutex::new(State {
                timer: timed.then(|| StreamTimer::new(SUBMIT_EVERY)),
                ..State::default()
            }),
            fault: Mutex::new(None),
            readback: Mutex::new(Vec::new()),
        });
        Self {
            inner: Some((core, Pipelines::default())),
        }
    }

    fn core(&self) -> &Arc<Core> {
        // Only `drop` takes it.
        &self.inner.as_ref().expect("stream used after drop").0
    }

    fn pipelines(&self) -> &Pipelines {
        &self.inner.as_ref().expect("stream used after drop").1
    }

    fn take_fault(&self) -> Result<()> {
        match self.core().fault.lock().take() {
            Some(msg) => Err(self.core().shared.backend_err(msg)),
            None => Ok(()),
        }
    }
}

impl Core {
    /// Records into this stream's encoder, under the quarantine lock when it is on; `record`
    /// runs inside a validation scope, so a bad command fails this call alone.
    /// `timed`: the pass `record` records, when the profile times passes; `record` gets its
    /// timestamp slots (none when the profile is off).
    fn encode(
        &self,
        timed: Option<profile::Timed>,
        record: impl FnOnce(&mut wgpu::CommandEncoder, Option<(wgpu::QuerySet, u32)>),
    ) -> Result<()> {
        let shared = &self.shared;
        let scope = shared
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let submit_now = {
            let mut guard = self.state.lock();
            let st = &mut *guard;
            // Quarantine: see `WgpuConfig::quarantine`; taken inside the state lock (one order).
            let _q = shared.quarantined();
            let enc = st.encoder.get_or_insert_with(|| {
                shared
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default())
            });
            let slots = match (timed, st.timer.as_mut()) {
                (Some(t), Some(timer)) => timer.next_pass(&shared.device, t),
                _ => None,
            };
            record(enc, slots);
            st.encoded += 1;
            st.encoded >= submit_after(shared.submit_ramp, st.since_wait)
        };
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(shared.backend_err(format!("encoding: {e}")));
        }
        if submit_now {
            self.pump(u64::MAX, false)?;
        }
        Ok(())
    }

    /// Finishes the current encoder into the held list (state lock held by the caller).
    fn finish_encoder(&self, st: &mut State) {
        if let Some(mut enc) = st.encoder.take() {
            if let Some(timer) = st.timer.as_mut() {
                timer.finish(&mut enc, st.finished);
            }
            let shared = &self.shared;
            let t = profile::now();
            let scope = shared
                .device
                .push_error_scope(wgpu::ErrorFilter::Validation);
            let buffer = {
                let _q = shared.quarantined();
                enc.finish()
            };
            profile::host_phase("  (in submit) finish the command buffer", t);
            if let Some(e) = pollster::block_on(scope.pop()) {
                self.fault.lock().get_or_insert(format!("encoding: {e}"));
            }
            st.held.push_back(buffer);
            st.finished += 1;
            st.since_wait = st.since_wait.saturating_add(1);
            st.encoded = 0;
        }
    }

    /// Submits held command buffers up to number `target` (exclusive; `u64::MAX` finishes
    /// the open encoder too) as far as barriers allow. With `block`, waits out the barriers
    /// (sleeps, other streams' submissions) without holding any lock; without, stops at the
    /// first barrier still in force. Another stream's state is only ever looked at with this
    /// stream's lock released, so two streams waiting on each other's events cannot deadlock.
    fn pump(&self, target: u64, block: bool) -> Result<()> {
        loop {
            let front = {
                let mut st = self.state.lock();
                if target == u64::MAX {
                    self.finish_encoder(&mut st);
                }
                let target = target.min(st.finished);
                let limit = match st.barriers.front() {
                    Some((pos, _)) => target.min((*pos).max(st.submitted)),
                    None => target,
                };
                if limit > st.submitted {
                    let n = (limit - st.submitted) as usize;
                    let buffers: Vec<_> = st.held.drain(..n).collect();
                    self.submit(&mut st, buffers)?;
                }
                if st.submitted >= target {
                    return Ok(());
                }
                // A barrier at the next buffer holds the rest back.
                match st.barriers.front() {
                    Some((_, b)) => b.clone(),
                    None => return Ok(()),
                }
            };
            let lifted = match &front.kind {
                BarrierKind::Until(t) if Instant::now() >= *t => true,
                BarrierKind::Until(t) if block => {
                    std::thread::sleep(t.saturating_duration_since(Instant::now()));
                    true
                }
                BarrierKind::After(ev) if ev.submission().is_some() => true,
                BarrierKind::After(ev) if block => {
                    ev.core.pump(ev.seq, true)?;
                    true
                }
                _ => return Ok(()),
            };
            if lifted {
                let mut st = self.state.lock();
                // Another thread may have lifted it meanwhile: pop only this very barrier.
                if st.barriers.front().is_some_and(|(_, b)| b.id == front.id) {
                    st.barriers.pop_front();
                }
            }
        }
    }

    /// Submits `buffers` (state lock held, so this stream's submissions keep their order).
    fn submit(&self, st: &mut State, buffers: Vec<wgpu::CommandBuffer>) -> Result<()> {
        let n = buffers.len() as u64;
        let shared = &self.shared;
        let scope = shared
            .device
            .push_error_scope(wgpu::ErrorFilter::Validation);
        let (index, done) = {
            let _q = shared.quarantined();
            let t = profile::now();
            let index = shared.queue.submit(buffers);
            profile::host_phase("  (in submit) Queue::submit", t);
            let t = profile::now();
            let done = Arc::new(AtomicBool::new(false));
            let flag = done.clone();
            // Fires once the newest submission (this one or a later one) completes.
            shared
                .queue
                .on_submitted_work_done(move || flag.store(true, Ordering::Release));
            profile::host_phase("  (in submit) on_submitted_work_done", t);
            (index, done)
        };
        st.submitted += n;
        st.last = Some(Arc::new(Submitted {
            index,
            done,
            at: Instant::now(),
        }));
        if let Some(e) = pollster::block_on(scope.pop()) {
            let msg = format!("submission: {e}");
            self.fault.lock().get_or_insert(msg.clone());
            return Err(shared.backend_err(msg));
        }
        Ok(())
    }

    /// Blocks until `sub` has completed.
    fn wait_for(&self, sub: &Submitted) -> Result<()> {
        if sub.done.load(Ordering::Acquire) {
            return Ok(());
        }
        self.wait_index(Some(sub.index.clone()))?;
        sub.done.store(true, Ordering::Release);
        Ok(())
    }

    /// Blocks until submission `index` (with `None`: every submission so far) has completed,
    /// for at most the device's wait limit: a wait the GPU never ends (a hung or lost device)
    /// fails with an error saying so instead of blocking its caller for ever.
    ///
    /// One `Device::poll` with the whole limit as its timeout, not a loop of short ones:
    /// wgpu-core 30 asserts (panics) when a timed-out wait finds the queue empty because
    /// another thread's poll retired the submission between the timeout and its own
    /// bookkeeping (seen on the H100 with a zero limit), so a timeout must only ever expire
    /// on a GPU that is really stuck. A lost device ends the wait at once (the driver's wait
    /// returns the loss, which wgpu reports as an error).
    fn wait_index(&self, index: Option<wgpu::SubmissionIndex>) -> Result<()> {
        let shared = &self.shared;
        if let Some(why) = shared.gpu.lost() {
            return Err(shared.backend_err(why));
        }
        let poll = shared.device.poll(wgpu::PollType::Wait {
            submission_index: index,
            timeout: Some(shared.wait_limit),
        });
        match poll {
            Ok(_) => Ok(()),
            Err(wgpu::PollError::Timeout) => Err(shared.backend_err(format!(
                "the GPU did not finish a submission within the wait limit of {:?} \
                 (WgpuConfig::wait_limit, STREAMPOOL_WGPU_WAIT_LIMIT_S){}",
                shared.wait_limit,
                shared
                    .gpu
                    .lost()
                    .map(|w| format!("; {w}"))
                    .unwrap_or_default()
            ))),
            Err(e) => Err(shared.backend_err(format!("waiting for the queue: {e}"))),
        }
    }
}

impl Core {
    /// Reads the profile's timestamps of this stream's command buffers numbered below
    /// `submitted`, which the caller has waited for (nothing when the profile is off).
    fn read_profile(&self, submitted: u64) -> Result<()> {
        let reads = match self.state.lock().timer.as_mut() {
            Some(timer) => timer.take_done(submitted),
            None => return Ok(()),
        };
        if reads.is_empty() {
            return Ok(());
        }
        let shared = &self.shared;
        // Only a device opened with timestamps has a timer.
        let period = shared.timestamp_period.unwrap_or(1.0);
        let reads = profile::read(&shared.device, period, shared.wait_limit, reads)
            .map_err(|msg| shared.backend_err(msg))?;
        if let Some(timer) = self.state.lock().timer.as_mut() {
            timer.give_back(reads);
        }
        Ok(())
    }
}

impl BackendStream for WgpuStream {
    fn fuses_matmul_bias(&self) -> bool {
        // Every matmul kernel adds the bias in its epilogue (`shaders/epilogue.wgsl`).
        true
    }

    fn fuses_matmul_act(&self, _act: Activation) -> bool {
        // Every activation of `bias_act.wgsl` is in the epilogue too.
        true
    }

    fn record(&self, timing: bool) -> Result<Arc<dyn BackendEvent>> {
        let seq = {
            let mut st = self.core().state.lock();
            if timing && st.encoder.is_none() {
                // A timed point gets a (possibly empty) buffer of its own, hence a submission
                // time even on a stream with no work yet.
                let enc = self
                    .core()
                    .shared
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
                st.encoder = Some(enc);
            }
            self.core().finish_encoder(&mut st);
            st.finished
        };
        // Submit now unless a barrier holds it back (then the event stays pending).
        self.core().pump(seq, false)?;
        Ok(Arc::new(WgpuEvent::new(self.core().clone(), seq)))
    }

    fn wait(&self, event: &Arc<dyn BackendEvent>) -> Result<()> {
        let event = event
            .as_any()
            .downcast_ref::<WgpuEvent>()
            .ok_or_else(|| Error::InvalidArgument("wait_event: event of another backend".into()))?;
        if Arc::ptr_eq(&event.core, self.core()) {
            return Ok(()); // same stream: ordered already
        }
        if !event.core.shared.same(&self.core().shared) {
            return Err(Error::InvalidArgument(
                "wait_event: event of another wgpu device".into(),
            ));
        }
        // One queue: once the event's work is submitted, everything this stream submits later
        // runs after it. (Were there several queues, this is where a host wait on the
        // event's submission, `event.synchronize()`, would go.)
        if event.submission().is_some() {
            return Ok(());
        }
        let mut st = self.core().state.lock();
        self.core().finish_encoder(&mut st);
        st.push_barrier(BarrierKind::After(Arc::new(event.clone_point())));
        Ok(())
    }

    fn synchronize(&self) -> Result<()> {
        let t = profile::now();
        self.core().pump(u64::MAX, true)?;
        profile::host_phase("synchronize: submit", t);
        let t = profile::now();
        let (last, submitted) = {
            let st = self.core().state.lock();
            (st.last.clone(), st.submitted)
        };
        if let Some(sub) = last {
            self.core().wait_for(&sub)?;
        }
        self.core().state.lock().since_wait = 0;
        profile::host_phase("synchronize: wait for the GPU", t);
        self.core().read_profile(submitted)?;
        self.take_fault()
    }

    unsafe fn launch(&self, kernel: Kernel) -> Result<()> {
        if let Kernel::Sleep { nanos } = kernel {
            let mut st = self.core().state.lock();
            self.core().finish_encoder(&mut st);
            // Sleeps queue up: this one starts when the previous one ends.
            let start = match st.barriers.back() {
                Some((
                    _,
                    Barrier {
                        kind: BarrierKind::Until(t),
                        ..
                    },
                )) => (*t).max(Instant::now()),
                _ => Instant::now(),
            };
            st.push_barrier(BarrierKind::Until(start + Duration::from_nanos(nanos)));
            return Ok(());
        }
        let shared = &self.core().shared;
        let t = profile::now();
        // Bind groups and parameter buffers are made outside the stream's lock: threads on
        // different streams prepare their launches in parallel.
        let Some(launch) = launch::prepare(self.pipelines(), shared, &kernel)? else {
            return Ok(()); // nothing to compute (an empty tensor)
        };
        profile::host_phase("launch: prepare (bind group, parameters)", t);
        let t = profile::now();
        let timed = shared
            .timestamp_period
            .map(|_| profile::Timed::of(&kernel, launch.note()));
        self.core()
            .encode(timed, |enc, slots| launch.record(enc, slots))?;
        profile::host_phase("launch: record (and submit every 32nd)", t);
        Ok(())
    }

    unsafe fn copy_from_host(&self, src: Vec<u8>, dst: DevicePtr) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let shared = &self.core().shared;
        let t = profile::now();
        let (buffer, offset) = shared.memory.resolve(dst)?;
        let size = (src.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if offset % wgpu::COPY_BUFFER_ALIGNMENT != 0 || offset + size > buffer.size() {
            return Err(Error::InvalidArgument(format!(
                "{}: upload of {} bytes at byte {offset} of a {}-byte buffer is not 4-byte aligned",
                shared.name,
                src.len(),
                buffer.size()
            )));
        }
        // A staging buffer mapped at creation, copied in stream order by the encoder (a
        // `Queue::write_buffer` would run before this stream's unsubmitted work; used only
        // when nothing was unsubmitted, it hung the parallel wgpu suite on the H100 and did
        // not lower the MLP call floor: 0.214 ms without it and kept read-back buffers,
        // 0.212 ms with both).
        let staging = shared.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("streampool upload"),
            size,
            usage: wgpu::BufferUsages::MAP_WRITE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: true,
        });
        {
            let mut view = staging
                .get_mapped_range_mut(..)
                .map_err(|e| shared.backend_err(format!("mapping an upload buffer: {e}")))?;
            view.slice(..src.len()).copy_from_slice(&src);
        }
        staging.unmap();
        self.core().encode(None, |enc, _| {
            enc.copy_buffer_to_buffer(&staging, 0, &buffer, offset, size)
        })?;
        profile::host_phase("upload: staging buffer and copy", t);
        Ok(())
    }

    unsafe fn copy_to_host(&self, src: DevicePtr, dst: &mut [u8]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let shared = &self.core().shared;
        let t = profile::now();
        let (buffer, offset) = shared.memory.resolve(src)?;
        // Copies move whole 4-byte words: widen the range to them (the buffer's size is a
        // multiple of 4, so the widened range stays inside it).
        let start = offset - offset % wgpu::COPY_BUFFER_ALIGNMENT;
        let end = (offset + dst.len() as u64).next_multiple_of(wgpu::COPY_BUFFER_ALIGNMENT);
        if end > buffer.size() {
            return Err(Error::InvalidArgument(format!(
                "{}: read of {} bytes at byte {offset} overruns a {}-byte buffer",
                shared.name,
                dst.len(),
                buffer.size()
            )));
        }
        let size = end - start;
        // A kept staging buffer when one is large enough (a new Vulkan buffer and its memory
        // cost more than the copy of a small read).
        let kept = {
            let mut pool = self.core().readback.lock();
            let i = pool.iter().position(|b| b.size() >= size);
            i.map(|i| pool.swap_remove(i))
        };
        let staging = kept.unwrap_or_else(|| {
            shared.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("streampool read-back"),
                size: if size <= READBACK_MAX {
                    size.next_power_of_two().max(256)
                } else {
                    size
                },
                usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        });
        self.core().encode(None, |enc, _| {
            enc.copy_buffer_to_buffer(&buffer, start, &staging, 0, end - start)
        })?;
        profile::host_phase("read-back: staging buffer and copy", t);
        let t = profile::now();
        self.core().pump(u64::MAX, true)?;
        let (sub, submitted) = {
            let st = self.core().state.lock();
            (st.last.clone(), st.submitted)
        };
        profile::host_phase("read-back: submit", t);
        let t = profile::now();
        let (tx, rx) = crossbeam_channel::bounded(1);
        staging.map_async(wgpu::MapMode::Read, ..size, move |r| {
            let _ = tx.send(r);
        });
        // Waits for this stream's newest submission (the copy), not for the whole queue; the
        // map callback runs inside a poll once the copy is done.
        let started = Instant::now();
        match sub {
            Some(sub) => self.core().wait_for(&sub)?,
            None => self.core().wait_index(None)?,
        }
        self.core().state.lock().since_wait = 0;
        profile::host_phase("read-back: wait for the GPU", t);
        let t = profile::now();
        // The copy is done: a non-blocking poll fires the callback, unless another thread's
        // poll took it first, which then fires it (a poll always runs the callbacks it takes).
        shared
            .device
            .poll(wgpu::PollType::Poll)
            .map_err(|e| shared.backend_err(format!("mapping: {e}")))?;
        let left = shared.wait_limit.saturating_sub(started.elapsed());
        let mapped = rx.recv_timeout(left).map_err(|_| {
            shared.backend_err(format!(
                "a read-back buffer was not mapped within the wait limit of {:?}",
                shared.wait_limit
            ))
        })?;
        mapped.map_err(|e| shared.backend_err(format!("mapping a read-back buffer: {e}")))?;
        profile::host_phase("read-back: map", t);
        let t = profile::now();
        {
            let view = staging
                .get_mapped_range(..size)
                .map_err(|e| shared.backend_err(format!("reading a read-back buffer: {e}")))?;
            let skip = (offset - start) as usize;
            dst.copy_from_slice(&view[skip..skip + dst.len()]);
        }
        staging.unmap();
        if shared.keep_readback && staging.size() <= READBACK_MAX {
            let mut pool = self.core().readback.lock();
            if pool.len() < READBACK_KEEP {
                pool.push(staging);
            }
        }
        profile::host_phase("read-back: copy out and unmap", t);
        self.core().read_profile(submitted)?;
        self.take_fault()
    }
}

/// A point in a stream: its first `seq` command buffers.
pub(crate) struct WgpuEvent {
    core: Arc<Core>,
    seq: u64,
    /// The submission covering the point, once known.
    resolved: Mutex<Option<Arc<Submitted>>>,
}

impl WgpuEvent {
    fn new(core: Arc<Core>, seq: u64) -> Self {
        let ev = Self {
            core,
            seq,
            resolved: Mutex::new(None),
        };
        ev.submission();
        ev
    }

    fn core(&self) -> &Arc<Core> {
        &self.core
    }

    fn clone_point(&self) -> WgpuEvent {
        WgpuEvent {
            core: self.core().clone(),
            seq: self.seq,
            resolved: Mutex::new(self.resolved.lock().clone()),
        }
    }

    /// The submission that covers the point, if its buffers are submitted. `None` for a
    /// point before any work is `Some` of nothing: see `is_empty`.
    fn submission(&self) -> Option<Option<Arc<Submitted>>> {
        if self.seq == 0 {
            return Some(None);
        }
        if let Some(s) = self.resolved.lock().as_ref() {
            return Some(Some(s.clone()));
        }
        let st = self.core().state.lock();
        if st.submitted < self.seq {
            return None;
        }
        // The stream's newest submission covers the point (it may also cover later work:
        // waiting for it is correct, if a little late, and happens only for events resolved
        // after further submissions).
        let last = st.last.clone();
        drop(st);
        *self.resolved.lock() = last.clone();
        Some(last)
    }
}

impl BackendEvent for WgpuEvent {
    fn query(&self) -> bool {
        let sub = match self.submission() {
            Some(s) => s,
            None => {
                // Held back by a barrier: submit if it has lifted meanwhile.
                if self.core().pump(self.seq, false).is_err() {
                    return false;
                }
                match self.submission() {
                    Some(s) => s,
                    None => return false,
                }
            }
        };
        let Some(sub) = sub else { return true };
        if sub.done.load(Ordering::Acquire) {
            return true;
        }
        // Runs due callbacks, `on_submitted_work_done`'s among them; never blocks.
        let _ = self.core().shared.device.poll(wgpu::PollType::Poll);
        sub.done.load(Ordering::Acquire)
    }

    fn synchronize(&self) -> Result<()> {
        self.core().pump(self.seq, true)?;
        match self.submission() {
            Some(Some(sub)) => self.core().wait_for(&sub),
            Some(None) => Ok(()),
            None => Err(self
                .core
                .shared
                .backend_err("event still unsubmitted after its stream was flushed".into())),
        }
    }

    fn elapsed_since(&self, earlier: &dyn BackendEvent) -> Result<Duration> {
        let earlier = earlier
            .as_any()
            .downcast_ref::<WgpuEvent>()
            .ok_or_else(|| {
                Error::InvalidArgument("elapsed: events of different backends".into())
            })?;
        self.synchronize()?;
        earlier.synchronize()?;
        // Host-side submission times: wgpu offers GPU timestamps only as an optional feature
        // (`TIMESTAMP_QUERY`), so this measures when each point's work entered the queue.
        let at = |e: &WgpuEvent| match e.submission() {
            Some(Some(s)) => Ok(s.at),
            _ => Err(Error::InvalidArgument(
                "elapsed: an event before any work has no time".into(),
            )),
        };
        Ok(at(self)?.saturating_duration_since(at(earlier)?))
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
