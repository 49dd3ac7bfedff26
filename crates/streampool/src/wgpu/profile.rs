//! Opt-in profile of the wgpu backend (the tunables' `wgpu.profile`,
//! `STREAMPOOL_WGPU_PROFILE`; [`crate::config`]): where a forward's time goes on the GPU,
//! per kernel and shape, and where a call's time goes on the host.
//!
//! - `STREAMPOOL_WGPU_PROFILE=1`: the device is opened with `TIMESTAMP_QUERY` where the
//!   adapter has it, and every launch's compute pass (one per launch, `Launch::record`)
//!   writes a GPU timestamp at its start and end. Each command buffer resolves its
//!   timestamps into a buffer copied for reading in the same command buffer; a stream reads
//!   them after its next host wait (a synchronize or read-back), so a profiled call still
//!   makes one submission per read-back. Vulkan writes both timestamps at the bottom of the
//!   pipe (`wgpu-hal`'s `write_timestamp`): a pass's start is when the work before it has
//!   drained, so a pass's time holds its barriers and dispatches, and the time between one
//!   pass's end and the next one's start is the GPU idle or running untimed copies (uploads,
//!   read-back copies).
//! - `STREAMPOOL_WGPU_PROFILE=host`: only the host phases (`Instant`s around preparing,
//!   recording, submitting, waiting, mapping and copying), with no timestamps and no change
//!   to the device.
//!
//! Off (unset), it costs the stream one read of the tunables per launch and read-back. The
//! totals are process-wide; the span and idle figures assume one stream at a time works
//! (several streams' passes interleave on the one queue, and each stream's span counts time
//! the others' work filled).

use std::collections::HashMap;
use std::time::Instant;

use parking_lot::Mutex;

use crate::kernel::Kernel;
use crate::profile::{label, work, KernelTime};

/// What the profile records.
pub(crate) use crate::config::WgpuProfiling as Mode;

/// The mode: the process's tunables' `wgpu.profile` ([`crate::config`]).
pub(crate) fn mode() -> Mode {
    crate::config::tuning().wgpu.profile
}

/// Everything recorded since the last [`wgpu_profile`]. `parking_lot` directly (not the
/// `sync` shim): a `const` static, locked only while profiling, never across a GPU wait.
static TOTALS: Mutex<Option<Totals>> = Mutex::new(None);

#[derive(Default)]
struct Totals {
    /// Per kernel label: calls, nanoseconds, flops, bytes.
    kernels: HashMap<String, (u64, u128, u64, u64)>,
    /// Per host phase: calls, nanoseconds.
    host: HashMap<&'static str, (u64, u128)>,
    busy_ns: u128,
    span_ns: u128,
    stretches: u64,
    /// Passes that got no timestamps (an encoder's query set was full).
    untimed: u64,
    /// Adapters that were asked for timestamps but have no `TIMESTAMP_QUERY`.
    unsupported: Vec<String>,
}

fn with_totals(f: impl FnOnce(&mut Totals)) {
    f(TOTALS.lock().get_or_insert_with(Totals::default))
}

/// The start of a host phase: `Some(now)` when profiling, `None` (no clock read) when off.
pub(crate) fn now() -> Option<Instant> {
    (mode() != Mode::Off).then(Instant::now)
}

/// Adds the host time since `since` ([`now`]) to `phase`; nothing when profiling is off.
pub(crate) fn host_phase(phase: &'static str, since: Option<Instant>) {
    let Some(since) = since else { return };
    let ns = since.elapsed().as_nanos();
    with_totals(|t| {
        let e = t.host.entry(phase).or_insert((0, 0));
        e.0 += 1;
        e.1 += ns;
    });
}

/// Notes that `adapter` was asked for timestamps and has none.
pub(crate) fn unsupported(adapter: &str) {
    with_totals(|t| {
        if !t.unsupported.iter().any(|a| a == adapter) {
            t.unsupported.push(adapter.to_string());
        }
    });
}

/// The wgpu profile so far ([`wgpu_profile`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WgpuProfile {
    /// GPU time per kernel and shape, longest total first (`STREAMPOOL_WGPU_PROFILE=1` on an
    /// adapter with `TIMESTAMP_QUERY`). A matmul's label ends with the kernel it took.
    pub kernels: Vec<KernelTime>,
    /// Host time per phase of a call (launch: prepare, record; read-back: record the copy,
    /// submit, wait for the GPU, map, copy out; ...), longest total first; `flops` and
    /// `bytes` are 0.
    pub host: Vec<KernelTime>,
    /// GPU time inside the timed passes, nanoseconds (the sum of `kernels`).
    pub busy_ns: u128,
    /// Summed over the stretches of a stream's work between two of its host waits: the time
    /// from the first timed pass's start to the last one's end. `span_ns - busy_ns` is the
    /// time between passes: GPU idle, or copies that are not timed.
    pub span_ns: u128,
    /// Stretches summed into `span_ns`.
    pub stretches: u64,
    /// Passes left untimed (more than an encoder's query set holds); 0 in a complete profile.
    pub untimed: u64,
    /// Adapters that were asked for timestamps (`STREAMPOOL_WGPU_PROFILE=1`) but lack
    /// `TIMESTAMP_QUERY`: their kernels are not in `kernels` (host phases still are).
    pub unsupported: Vec<String>,
}

/// The wgpu profile so far, and resets it. Empty unless `STREAMPOOL_WGPU_PROFILE` was `1`
/// or `host` when the first wgpu device opened (or the first call ran).
///
/// ```
/// let p = streampool::wgpu_profile();
/// assert!(p.busy_ns <= p.span_ns || p.stretches == 0);
/// ```
pub fn wgpu_profile() -> WgpuProfile {
    let t = TOTALS.lock().take().unwrap_or_default();
    let mut kernels: Vec<KernelTime> = t
        .kernels
        .into_iter()
        .map(|(label, (calls, total_ns, flops, bytes))| KernelTime {
            label,
            calls,
            total_ns,
            flops,
            bytes,
        })
        .collect();
    kernels.sort_by_key(|k| std::cmp::Reverse(k.total_ns));
    let mut host: Vec<KernelTime> = t
        .host
        .into_iter()
        .map(|(label, (calls, total_ns))| KernelTime {
            label: label.to_string(),
            calls,
            total_ns,
            flops: 0,
            bytes: 0,
        })
        .collect();
    host.sort_by_key(|k| std::cmp::Reverse(k.total_ns));
    WgpuProfile {
        kernels,
        host,
        busy_ns: t.busy_ns,
        span_ns: t.span_ns,
        stretches: t.stretches,
        untimed: t.untimed,
        unsupported: t.unsupported,
    }
}

/// What a timed pass is: its label and work.
pub(crate) struct Timed {
    label: String,
    flops: u64,
    bytes: u64,
}

impl Timed {
    /// `kernel`, with `note` (the matmul kernel taken) after its label.
    pub(crate) fn of(kernel: &Kernel, note: Option<String>) -> Self {
        let (flops, bytes) = work(kernel);
        let mut label = label(kernel);
        if let Some(n) = note {
            label = format!("{label} [{n}]");
        }
        Self {
            label,
            flops,
            bytes,
        }
    }
}

/// A query set with its resolve and read-back buffers, reused once read.
struct Slots {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    readback: wgpu::Buffer,
}

/// The timestamps of one command buffer.
struct Buffer {
    slots: Slots,
    passes: Vec<Timed>,
}

/// A command buffer's timestamps resolved and copied, to read once it is done.
struct Pending {
    /// Its number in the stream's sequence of command buffers.
    seq: u64,
    buffer: Buffer,
}

/// A stream's timestamps: the open encoder's, those awaiting their read, spare slots.
/// Held in the stream's state (under its lock).
pub(crate) struct StreamTimer {
    /// Passes one encoder holds at most (two queries each).
    capacity: u32,
    open: Option<Buffer>,
    pending: Vec<Pending>,
    spare: Vec<Slots>,
}

impl StreamTimer {
    pub(crate) fn new(passes_per_encoder: usize) -> Self {
        Self {
            // Bounded by wgpu's QUERY_SET_MAX_QUERIES (4096 queries).
            capacity: passes_per_encoder.clamp(1, 2048) as u32,
            open: None,
            pending: Vec::new(),
            spare: Vec::new(),
        }
    }

    /// The timestamp writes of the next pass of the open encoder, which `timed` describes;
    /// `None` (the pass goes untimed, and is counted) when the encoder's set is full.
    pub(crate) fn next_pass(
        &mut self,
        device: &wgpu::Device,
        timed: Timed,
    ) -> Option<(wgpu::QuerySet, u32)> {
        let capacity = self.capacity;
        let open = match &mut self.open {
            Some(b) => b,
            None => {
                let slots = self
                    .spare
                    .pop()
                    .unwrap_or_else(|| new_slots(device, capacity));
                self.open.insert(Buffer {
                    slots,
                    passes: Vec::new(),
                })
            }
        };
        if open.passes.len() as u32 >= capacity {
            with_totals(|t| t.untimed += 1);
            return None;
        }
        let index = 2 * open.passes.len() as u32;
        open.passes.push(timed);
        Some((open.slots.set.clone(), index))
    }

    /// Resolves the open encoder's timestamps into its read-back buffer, as the last
    /// commands of `enc`, the stream's command buffer number `seq`.
    pub(crate) fn finish(&mut self, enc: &mut wgpu::CommandEncoder, seq: u64) {
        let Some(buffer) = self.open.take() else {
            return;
        };
        if buffer.passes.is_empty() {
            self.spare.push(buffer.slots);
            return;
        }
        let queries = 2 * buffer.passes.len() as u32;
        let s = &buffer.slots;
        enc.resolve_query_set(&s.set, 0..queries, &s.resolve, 0);
        enc.copy_buffer_to_buffer(&s.resolve, 0, &s.readback, 0, 8 * queries as u64);
        self.pending.push(Pending { seq, buffer });
    }

    /// Takes the pending timestamps of command buffers numbered below `submitted` (all
    /// done: the caller waited for the submission that covers them).
    pub(crate) fn take_done(&mut self, submitted: u64) -> Vec<PendingRead> {
        let (done, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|p| p.seq < submitted);
        self.pending = later;
        done.into_iter().map(|p| PendingRead(p.buffer)).collect()
    }

    /// Gives read slots back for reuse.
    pub(crate) fn give_back(&mut self, slots: Vec<PendingRead>) {
        self.spare.extend(slots.into_iter().map(|p| p.0.slots));
    }
}

/// Timestamps of a finished command buffer, taken out of the stream's state to be read
/// without its lock.
pub(crate) struct PendingRead(Buffer);

fn new_slots(device: &wgpu::Device, passes: u32) -> Slots {
    let bytes = 16 * passes as u64;
    Slots {
        set: device.create_query_set(&wgpu::QuerySetDescriptor {
            label: Some("streampool profile"),
            ty: wgpu::QueryType::Timestamp,
            count: 2 * passes,
        }),
        resolve: device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("streampool profile resolve"),
            size: bytes,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        }),
        readback: device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("streampool profile read-back"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        }),
    }
}

/// Maps `reads` (their command buffers are done), adds their passes to the totals as one
/// stretch, and returns them for reuse. `period`: nanoseconds per timestamp tick.
pub(crate) fn read(
    device: &wgpu::Device,
    period: f32,
    limit: std::time::Duration,
    reads: Vec<PendingRead>,
) -> std::result::Result<Vec<PendingRead>, String> {
    if reads.is_empty() {
        return Ok(reads);
    }
    let started = Instant::now();
    let (tx, rx) = crossbeam_channel::unbounded();
    for (i, r) in reads.iter().enumerate() {
        let tx = tx.clone();
        let bytes = 16 * r.0.passes.len() as u64;
        r.0.slots
            .readback
            .map_async(wgpu::MapMode::Read, ..bytes, move |res| {
                let _ = tx.send((i, res));
            });
    }
    // Their work is done: a poll fires the callbacks (or another thread's poll did).
    device
        .poll(wgpu::PollType::Poll)
        .map_err(|e| format!("profile: polling: {e}"))?;
    for _ in 0..reads.len() {
        let left = limit.saturating_sub(started.elapsed());
        let (_, res) = rx
            .recv_timeout(left)
            .map_err(|_| "profile: timestamps not mapped within the wait limit".to_string())?;
        res.map_err(|e| format!("profile: mapping timestamps: {e}"))?;
    }
    let mut passes: Vec<(u64, u64)> = Vec::new();
    let mut labelled = Vec::new();
    for r in &reads {
        let bytes = 16 * r.0.passes.len() as u64;
        {
            let view =
                r.0.slots
                    .readback
                    .get_mapped_range(..bytes)
                    .map_err(|e| format!("profile: reading timestamps: {e}"))?;
            for (pair, timed) in view.chunks_exact(16).zip(&r.0.passes) {
                let tick = |b: &[u8]| {
                    // `chunks_exact(16)` halves: always 8 bytes.
                    u64::from_le_bytes(b.try_into().expect("8-byte timestamp"))
                };
                passes.push((tick(&pair[..8]), tick(&pair[8..])));
                labelled.push(timed);
            }
        }
        r.0.slots.readback.unmap();
    }
    let ns = |ticks: u64| (ticks as f64 * period as f64) as u128;
    let busy: Vec<u128> = passes
        .iter()
        .map(|&(a, b)| ns(b.saturating_sub(a)))
        .collect();
    let first = passes.iter().map(|p| p.0).min().unwrap_or(0);
    let last = passes.iter().map(|p| p.1).max().unwrap_or(0);
    with_totals(|t| {
        for (timed, ns) in labelled.iter().zip(&busy) {
            let e = t.kernels.entry(timed.label.clone()).or_insert((0, 0, 0, 0));
            e.0 += 1;
            e.1 += ns;
            e.2 += timed.flops;
            e.3 += timed.bytes;
        }
        t.busy_ns += busy.iter().sum::<u128>();
        t.span_ns += ns(last.saturating_sub(first));
        t.stretches += 1;
    });
    host_phase("profile: read timestamps", Some(started));
    Ok(reads)
}
