//! Graphs: a model call with fixed input shapes, captured once per (stream, shapes) and
//! replayed with one launch.
//!
//! [`GraphCache::run`] runs a closure over input tensors. On a backend without graphs (the
//! CPU) it simply calls the closure, so the same model code runs everywhere. On CUDA:
//!
//! 1. The first call for a key (stream slot, name, input shapes and dtypes) runs eagerly and
//!    notes the sizes the closure allocates (a *trace*). Shapes seen once stay eager.
//! 2. The second call captures the closure into a graph on the stream's private capture
//!    stream (thread-local capture mode; a per-stream lock keeps other threads' work out).
//!    Every allocation inside the capture comes from the graph's own *pool*, taken from the
//!    caching allocator before the capture in the traced sizes and held until the graph is
//!    dropped, so the allocator can never hand that memory to another stream while a replay
//!    may still touch it. Tensors the closure reads (weights) are kept alive by the graph.
//! 3. Every later call replays: the inputs are copied into the graph's static input buffers
//!    (after waiting for their writers, as any op does), the graph is launched, and the
//!    outputs are copied out into fresh tensors owned by the caller. One lock per graph
//!    orders these three steps among threads sharing the stream; it is held only while the
//!    work is queued.
//!
//! A capture that fails (the closure waits on the host, uploads, or allocates differently
//! from its trace) marks the key eager. At most `capacity` keys are kept; the least recently
//! used is evicted, and its graph, once its last replay has completed, gives its pool back.

use std::cell::RefCell;
use std::collections::{HashMap, VecDeque};

use crate::allocator::{size_class, Block};
use crate::backend::{BackendGraph, BackendPinned, DevicePtr};
use crate::dtype::{as_bytes, as_bytes_mut};
use crate::kernel::{Kernel, Strided};
use crate::storage::Storage;
use crate::sync::{Arc, Mutex};
use crate::sync::{AtomicBool, Ordering};
use crate::tensor::ZerosLike;
use crate::tensor::{launch_on, Dims, OutSpec};
use crate::{DType, Device, Element, Error, Result, Stream, StreamGuard, Tensor};

/// What a thread is doing for a graph while it runs a closure.
enum Hook {
    /// Eager run: note the sizes allocated.
    Trace { device: u64, sizes: Vec<usize> },
    /// Capture: allocate from the pool (in traced order) and keep every input alive.
    Capture {
        device: u64,
        blocks: VecDeque<(DevicePtr, usize)>,
        keep: Vec<Tensor>,
    },
}

thread_local! {
    static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
}

/// Allocates an op output of `bytes` on `stream`: from the graph pool while this thread
/// captures a graph on `stream`'s device, else from the caching allocator. The flag says
/// whether the block belongs to a graph pool (its storage must not free it).
pub(crate) fn alloc(device: &Device, bytes: usize, stream: &Stream) -> Result<(Block, bool)> {
    let pooled = HOOK.with(|h| match &mut *h.borrow_mut() {
        Some(Hook::Trace { device: d, sizes }) if *d == device.id() => {
            sizes.push(bytes);
            None
        }
        Some(Hook::Capture {
            device: d, blocks, ..
        }) if *d == device.id() => Some(blocks.pop_front().ok_or(())),
        _ => None,
    });
    match pooled {
        None => Ok((
            device
                .allocator()
                .alloc(bytes, stream.index(), stream.inner.as_ref())?,
            false,
        )),
        Some(Ok((ptr, size))) if size == size_class(bytes) => Ok((
            Block {
                ptr,
                size,
                stream: stream.index(),
            },
            true,
        )),
        Some(_) => Err(Error::InvalidArgument(
            "graph capture: allocations differ from the traced eager run".into(),
        )),
    }
}

/// Notes the inputs of an op: while capturing, the graph keeps them alive (its kernels read
/// their memory on every replay).
pub(crate) fn note_inputs(device: &Device, inputs: &[&Tensor]) {
    HOOK.with(|h| {
        if let Some(Hook::Capture {
            device: d, keep, ..
        }) = &mut *h.borrow_mut()
        {
            if *d == device.id() {
                keep.extend(inputs.iter().map(|&t| t.clone()));
            }
        }
    });
}

/// Sets the thread's hook for the length of a closure and takes it back afterwards (also on
/// error), so a failed run never leaves a hook behind.
fn with_hook<R>(hook: Hook, f: impl FnOnce() -> R) -> (R, Hook) {
    let previous = HOOK.with(|h| h.borrow_mut().replace(hook));
    let r = f();
    let hook = HOOK.with(|h| std::mem::replace(&mut *h.borrow_mut(), previous));
    // Invariant: set above and only replaced by nested hooks, which restore it.
    (r, hook.expect("graph hook set for this closure"))
}

#[derive(Clone, PartialEq, Eq, Hash)]
struct Key {
    device: u64,
    stream: usize,
    name: String,
    inputs: Vec<(Vec<usize>, DType)>,
}

/// What a traced eager run allocated (in order) and, for host graphs, its output sizes.
#[derive(Clone)]
struct Trace {
    sizes: Vec<usize>,
    out_bytes: Vec<usize>,
}

enum Slot {
    /// Seen once: what that eager run allocated.
    Seen(Trace),
    Ready(Arc<Graph>),
    /// Capture failed: always eager.
    Eager,
}

struct Entry {
    slot: Slot,
    used: u64,
}

#[derive(Default)]
struct CacheState {
    entries: HashMap<Key, Entry>,
    tick: u64,
}

/// Graphs of one model, keyed by (stream, name, input shapes); see the module docs.
///
/// ```
/// use streampool::{Device, GraphCache, Tensor};
/// let dev = Device::cpu();
/// let w = Tensor::randn(&[4, 4], 1, &dev).unwrap();
/// let graphs = GraphCache::new(16);
/// let x = Tensor::randn(&[2, 4], 2, &dev).unwrap();
/// for _ in 0..3 {
///     // Eager on the CPU; captured on the second call and replayed after that on CUDA.
///     let y = graphs
///         .run("matmul", &[&x], |ins| Ok::<_, streampool::Error>(vec![ins[0].matmul(&w)?]))
///         .unwrap();
///     assert_eq!(y[0].dims(), &[2, 4]);
/// }
/// ```
pub struct GraphCache {
    capacity: usize,
    /// Most bytes the kept graphs' pools may hold together; a shape whose trace alone is over
    /// an eighth of it stays eager (see [`GraphCache::with_max_bytes`]).
    max_bytes: usize,
    enabled: bool,
    state: Mutex<CacheState>,
}

/// Graph statistics of a [`GraphCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Keys with a captured graph.
    pub graphs: usize,
    /// Keys seen once (eager, traced).
    pub seen: usize,
    /// Keys that run eagerly for good: the capture failed, or the shape is over the
    /// memory budget's limit for one graph.
    pub eager: usize,
    /// Bytes the kept graphs' pools hold.
    pub pool_bytes: usize,
}

impl std::fmt::Debug for GraphCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphCache")
            .field("capacity", &self.capacity)
            .field("max_bytes", &self.max_bytes)
            .field("enabled", &self.enabled)
            .field("stats", &self.stats())
            .finish()
    }
}

enum Action {
    Replay(Arc<Graph>),
    Eager,
    Trace,
    Capture(Trace),
}

impl GraphCache {
    /// A cache keeping at most `capacity` keys (at least 1). `STREAMPOOL_GRAPHS=0` in the
    /// environment turns graphs off (every call eager), to compare.
    ///
    /// The graphs' pools together hold at most [`DEFAULT_GRAPH_MEMORY`] bytes
    /// (`STREAMPOOL_GRAPH_MEMORY_MB` in the environment overrides it; see
    /// [`GraphCache::with_max_bytes`]).
    pub fn new(capacity: usize) -> Self {
        let max_bytes = std::env::var("STREAMPOOL_GRAPH_MEMORY_MB")
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .map_or(DEFAULT_GRAPH_MEMORY, |mb| mb.saturating_mul(1 << 20));
        Self {
            capacity: capacity.max(1),
            max_bytes,
            enabled: std::env::var("STREAMPOOL_GRAPHS").map_or(true, |v| v != "0"),
            state: Mutex::new(CacheState::default()),
        }
    }

    /// The same cache with a memory budget: the kept graphs' pools hold at most `max_bytes`
    /// together (the least recently used are evicted past it), and a shape whose eager run
    /// allocated more than an eighth of it is never captured. Why: every graph keeps its
    /// own pool (all its activations) for as long as it is kept, so a server whose batches
    /// vary in rows and length (continuous batching) would otherwise keep hundreds of pools;
    /// measured on the H100, MiniLM's graphs grew to 82 GB and the device ran out of
    /// memory. Large shapes lose nothing by staying eager: their GPU time dwarfs the launch
    /// overhead a graph saves.
    pub fn with_max_bytes(mut self, max_bytes: usize) -> Self {
        self.max_bytes = max_bytes;
        self
    }

    /// The same cache with graphs on or off (off: every call runs `f` eagerly).
    pub fn with_enabled(mut self, enabled: bool) -> Self {
        self.enabled = enabled;
        self
    }

    /// Whether graphs are used at all.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Runs `f(inputs)` on the calling thread's current stream of the inputs' device, through
    /// a graph where the backend has them (see the module docs). `f` must be a pure function
    /// of its inputs and of tensors that live as long as the cache (weights), and must
    /// return the same shapes for the same input shapes. It runs eagerly the first time a
    /// key is seen and whenever graphs are unavailable.
    ///
    /// `f` may return any error type that a runtime [`Error`] converts into (a model crate's
    /// own error enum), so model code needs no conversion.
    pub fn run<F, E>(
        &self,
        name: &str,
        inputs: &[&Tensor],
        f: F,
    ) -> std::result::Result<Vec<Tensor>, E>
    where
        F: Fn(&[Tensor]) -> std::result::Result<Vec<Tensor>, E>,
        E: From<Error> + std::fmt::Display,
    {
        let owned: Vec<Tensor> = inputs.iter().map(|&t| t.clone()).collect();
        let Some(first) = inputs.first() else {
            return f(&owned);
        };
        let device = first.device().clone();
        if !self.enabled
            || device.eager_events()
            || inputs.iter().any(|t| !t.device().same(&device))
        {
            return f(&owned);
        }
        let stream = device.current_stream()?;
        if !stream.inner.has_graphs() {
            return f(&owned);
        }
        let key = Key {
            device: device.id(),
            stream: stream.index(),
            name: name.to_string(),
            inputs: inputs
                .iter()
                .map(|t| (t.dims().to_vec(), t.dtype()))
                .collect(),
        };
        match self.action(&key) {
            Action::Replay(g) => Ok(g.replay(inputs)?),
            Action::Eager => f(&owned),
            Action::Trace => {
                let hook = Hook::Trace {
                    device: device.id(),
                    sizes: Vec::new(),
                };
                let (out, hook) = with_hook(hook, || f(&owned));
                let out = out?;
                if let Hook::Trace { sizes, .. } = hook {
                    let out_bytes = Vec::new();
                    self.insert(key, Slot::Seen(Trace { sizes, out_bytes }));
                }
                Ok(out)
            }
            Action::Capture(trace) => match Graph::capture(&stream, &trace.sizes, inputs, None, &f)
            {
                Ok(g) => {
                    let g = Arc::new(g);
                    self.insert(key, Slot::Ready(g.clone()));
                    Ok(g.replay(inputs)?)
                }
                Err(e) => {
                    tracing::warn!(error = %e, name, "graph capture failed; running eagerly");
                    self.insert(key, Slot::Eager);
                    f(&owned)
                }
            },
        }
    }

    /// What to do for `key` now (and marks it used).
    fn action(&self, key: &Key) -> Action {
        let mut st = self.state.lock();
        st.tick += 1;
        let tick = st.tick;
        match st.entries.get_mut(key) {
            Some(e) => {
                e.used = tick;
                match &e.slot {
                    Slot::Ready(g) => Action::Replay(g.clone()),
                    Slot::Seen(trace) if trace.sizes.iter().sum::<usize>() > self.max_bytes / 8 => {
                        e.slot = Slot::Eager;
                        Action::Eager
                    }
                    Slot::Seen(trace) => Action::Capture(trace.clone()),
                    Slot::Eager => Action::Eager,
                }
            }
            None => Action::Trace,
        }
    }

    /// One call from host data to host data: uploads `inputs` (each `(values, shape)`) to
    /// `device`, runs `f`, and returns every output's values. Where the backend has graphs,
    /// the whole call (upload, `f`, read-back) is one graph per (stream, shapes) with pinned
    /// host buffers inside it, so a replay costs one graph launch and one event wait: no
    /// allocation, no tensor, no other driver call. A call that finds its graph in use by
    /// another thread on the same stream, and every call where graphs are unavailable, runs
    /// eagerly (`from_slice`, `f`, `to_vec`). All outputs must have element type `T`.
    ///
    /// ```
    /// use streampool::{Device, GraphCache, Tensor};
    /// let dev = Device::cpu();
    /// let graphs = GraphCache::new(4);
    /// let out = graphs
    ///     .run_host("double", &dev, &[(&[1.0f32, 2.0][..], &[2][..])], |i| {
    ///         Ok::<_, streampool::Error>(vec![i[0].scale(2.0)?])
    ///     })
    ///     .unwrap();
    /// assert_eq!(out, vec![vec![2.0, 4.0]]);
    /// ```
    pub fn run_host<T, F, E>(
        &self,
        name: &str,
        device: &Device,
        inputs: &[(&[T], &[usize])],
        f: F,
    ) -> std::result::Result<Vec<Vec<T>>, E>
    where
        T: Element,
        F: Fn(&[Tensor]) -> std::result::Result<Vec<Tensor>, E>,
        E: From<Error> + std::fmt::Display,
    {
        let upload = || -> Result<Vec<Tensor>> {
            inputs
                .iter()
                .map(|(data, shape)| Tensor::from_slice(data, shape, device))
                .collect()
        };
        let eager = || -> std::result::Result<Vec<Vec<T>>, E> {
            let outs = f(&upload()?)?;
            Ok(outs
                .iter()
                .map(|o| o.to_vec::<T>())
                .collect::<Result<Vec<_>>>()?)
        };
        if !self.enabled || device.eager_events() {
            return eager();
        }
        let stream = device.current_stream()?;
        if !stream.inner.has_graphs() {
            return eager();
        }
        let key = Key {
            device: device.id(),
            stream: stream.index(),
            name: format!("{name} (host)"),
            inputs: inputs.iter().map(|(_, s)| (s.to_vec(), T::DTYPE)).collect(),
        };
        match self.action(&key) {
            Action::Replay(g) => match g.replay_host(inputs)? {
                Some(out) => Ok(out),
                None => eager(),
            },
            Action::Eager => eager(),
            Action::Trace => {
                let ts = upload()?;
                let hook = Hook::Trace {
                    device: device.id(),
                    sizes: Vec::new(),
                };
                // Traced as captured: `f`, then each output made contiguous.
                let (outs, hook) = with_hook(hook, || -> std::result::Result<Vec<Tensor>, E> {
                    let outs = f(&ts)?;
                    Ok(outs
                        .iter()
                        .map(|o| o.contiguous())
                        .collect::<Result<Vec<_>>>()?)
                });
                let outs = outs?;
                let values = outs
                    .iter()
                    .map(|o| o.to_vec::<T>())
                    .collect::<Result<Vec<_>>>()?;
                if let Hook::Trace { sizes, .. } = hook {
                    let out_bytes = outs
                        .iter()
                        .map(|o| o.elem_count() * o.dtype().size())
                        .collect();
                    self.insert(key, Slot::Seen(Trace { sizes, out_bytes }));
                }
                Ok(values)
            }
            Action::Capture(trace) => {
                let ts = upload()?;
                let refs: Vec<&Tensor> = ts.iter().collect();
                match Graph::capture(&stream, &trace.sizes, &refs, Some(&trace.out_bytes), &f) {
                    Ok(g) => {
                        let g = Arc::new(g);
                        self.insert(key, Slot::Ready(g.clone()));
                        match g.replay_host(inputs)? {
                            Some(out) => Ok(out),
                            None => eager(),
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, name, "graph capture failed; running eagerly");
                        self.insert(key, Slot::Eager);
                        eager()
                    }
                }
            }
        }
    }

    /// Inserts or replaces `key`, evicting the least recently used key when full. Evicted
    /// graphs are dropped after the lock is released (dropping waits for their last replay).
    fn insert(&self, key: Key, slot: Slot) {
        let evicted = {
            let mut st = self.state.lock();
            st.tick += 1;
            let used = st.tick;
            let mut evicted = Vec::new();
            if !st.entries.contains_key(&key) && st.entries.len() >= self.capacity {
                if let Some(oldest) = st
                    .entries
                    .iter()
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| k.clone())
                {
                    evicted.extend(st.entries.remove(&oldest));
                }
            }
            evicted.extend(st.entries.insert(key.clone(), Entry { slot, used }));
            // The memory budget: the least recently used graphs go until the pools fit (the
            // one just inserted stays, whatever its size).
            let pool_bytes = |e: &Entry| match &e.slot {
                Slot::Ready(g) => g.pool_bytes(),
                _ => 0,
            };
            let mut held: usize = st.entries.values().map(pool_bytes).sum();
            while held > self.max_bytes {
                let Some(oldest) = st
                    .entries
                    .iter()
                    .filter(|(k, e)| **k != key && pool_bytes(e) > 0)
                    .min_by_key(|(_, e)| e.used)
                    .map(|(k, _)| k.clone())
                else {
                    break;
                };
                if let Some(e) = st.entries.remove(&oldest) {
                    held -= pool_bytes(&e);
                    evicted.push(e);
                }
            }
            evicted
        };
        drop(evicted);
    }

    /// Counts of keys by state.
    pub fn stats(&self) -> GraphStats {
        let st = self.state.lock();
        let mut s = GraphStats::default();
        for e in st.entries.values() {
            match &e.slot {
                Slot::Ready(g) => {
                    s.graphs += 1;
                    s.pool_bytes += g.pool_bytes();
                }
                Slot::Seen(_) => s.seen += 1,
                Slot::Eager => s.eager += 1,
            }
        }
        s
    }

    /// Drops every graph (each gives its pool back once its last replay has completed).
    pub fn clear(&self) {
        let entries = std::mem::take(&mut self.state.lock().entries);
        drop(entries);
    }
}

/// A static buffer of a graph: where it lives and the view of it.
struct StaticView {
    ptr: DevicePtr,
    shape: Vec<usize>,
    strides: Vec<usize>,
    dtype: DType,
}

/// The default memory budget of a [`GraphCache`]'s graphs: 4 GiB.
pub const DEFAULT_GRAPH_MEMORY: usize = 4 << 30;

/// One captured call: replayable on the stream it belongs to.
struct Graph {
    stream: Stream,
    exec: Option<Box<dyn BackendGraph>>,
    inputs: Vec<StaticView>,
    outputs: Vec<StaticView>,
    /// Pool blocks (static inputs and every allocation of the capture), given back on drop.
    pool: Vec<(DevicePtr, usize)>,
    /// Tensors the graph's kernels read (weights, outputs that are not pool memory).
    keep: Vec<Tensor>,
    /// Orders copy-in, launch and copy-out among threads sharing the stream.
    replay_lock: Mutex<()>,
    /// For host-to-host graphs ([`GraphCache::run_host`]): the pinned buffers the graph's
    /// first and last nodes copy from and to.
    host: Option<HostIo>,
}

impl Graph {
    /// Bytes its pool holds.
    fn pool_bytes(&self) -> usize {
        self.pool.iter().map(|&(_, size)| size).sum()
    }
}

/// Pinned input and output buffers of a host-to-host graph, with the flag that gives them to
/// one call at a time.
struct HostIo {
    inputs: Vec<(Box<dyn BackendPinned>, usize)>,
    outputs: Vec<(Box<dyn BackendPinned>, usize)>,
    /// Set while a call owns the buffers (from writing the inputs to reading the outputs).
    /// Never waited on: a call that finds it set runs eagerly instead. Left set for good
    /// after a failed wait, when the buffers can no longer be proven idle.
    busy: AtomicBool,
}

impl Graph {
    fn capture<F, E>(
        stream: &Stream,
        sizes: &[usize],
        inputs: &[&Tensor],
        host_out: Option<&[usize]>,
        f: &F,
    ) -> Result<Graph>
    where
        F: Fn(&[Tensor]) -> std::result::Result<Vec<Tensor>, E>,
        E: std::fmt::Display,
    {
        let device = stream.device().clone();
        let side = stream
            .inner
            .capture_stream()?
            .ok_or_else(|| Error::Unavailable("graphs: not on this backend".into()))?;
        // Inputs' and weights' writers must be known complete before capture: a wait on
        // another stream's event cannot be captured. One host wait per capture.
        for t in inputs {
            t.storage().prepare_use(stream)?;
        }
        stream.inner.record(false)?.synchronize()?;
        let mut graph = Graph {
            stream: stream.clone(),
            exec: None,
            inputs: Vec::new(),
            outputs: Vec::new(),
            pool: Vec::new(),
            keep: Vec::new(),
            replay_lock: Mutex::new(()),
            host: None,
        };
        // From here on, `graph`'s drop gives back whatever the pool holds.
        let alloc = |graph: &mut Graph, bytes: usize| -> Result<DevicePtr> {
            let b = device
                .allocator()
                .alloc(bytes, stream.index(), stream.inner.as_ref())?;
            graph.pool.push((b.ptr, b.size));
            Ok(b.ptr)
        };
        let capture_stream = Stream::new(device.clone(), stream.index(), side.clone());
        let mut statics = Vec::with_capacity(inputs.len());
        for t in inputs {
            let bytes = t.elem_count().max(1) * t.dtype().size();
            let ptr = alloc(&mut graph, bytes)?;
            let block = Block {
                ptr,
                size: size_class(bytes),
                stream: stream.index(),
            };
            let storage = Storage::new(device.clone(), block, &capture_stream, None).graph_owned();
            statics.push(Tensor::from_storage(
                storage,
                Dims::from_slice(t.dims()),
                t.dtype(),
            ));
            graph.inputs.push(StaticView {
                ptr,
                shape: t.dims().to_vec(),
                strides: crate::tensor::contiguous_strides(t.dims()),
                dtype: t.dtype(),
            });
        }
        let mut blocks = VecDeque::with_capacity(sizes.len());
        for &bytes in sizes {
            let ptr = alloc(&mut graph, bytes)?;
            blocks.push_back((ptr, size_class(bytes)));
        }
        let hook = Hook::Capture {
            device: device.id(),
            blocks,
            keep: Vec::new(),
        };
        // Pinned buffers are allocated before the capture (inside it that would be an error),
        // outputs in the sizes the traced eager run returned.
        let host = match host_out {
            Some(out_bytes) => {
                let mut io = HostIo {
                    inputs: Vec::new(),
                    outputs: Vec::new(),
                    busy: AtomicBool::new(false),
                };
                for st in &graph.inputs {
                    let bytes = st.shape.iter().product::<usize>() * st.dtype.size();
                    io.inputs.push((side.alloc_pinned(bytes)?, bytes));
                }
                for &bytes in out_bytes {
                    io.outputs.push((side.alloc_pinned(bytes)?, bytes));
                }
                Some(io)
            }
            None => None,
        };
        let mut outs = Vec::new();
        let (exec, hook) = with_hook(hook, || {
            let _on_side = StreamGuard::new(&capture_stream);
            side.capture(&mut || {
                if let Some(io) = &host {
                    for ((pinned, bytes), st) in io.inputs.iter().zip(&graph.inputs) {
                        // SAFETY: the static input holds `bytes`; the pinned buffer is written
                        // by a call only while it owns the graph (`HostIo::busy`).
                        unsafe { side.copy_pinned_to_device(pinned.as_ref(), st.ptr, *bytes)? };
                    }
                }
                outs = f(&statics).map_err(|e| {
                    Error::InvalidArgument(format!("graph capture: the closure failed: {e}"))
                })?;
                if let Some(io) = &host {
                    if io.outputs.len() != outs.len() {
                        return Err(Error::InvalidArgument(
                            "graph capture: outputs differ from the traced run".into(),
                        ));
                    }
                    for (o, (pinned, bytes)) in outs.iter_mut().zip(&io.outputs) {
                        // Host outputs are copied as one block (the trace did the same).
                        *o = o.contiguous()?;
                        if o.elem_count() * o.dtype().size() != *bytes {
                            return Err(Error::InvalidArgument(
                                "graph capture: output sizes differ from the traced run".into(),
                            ));
                        }
                        // SAFETY: `o` holds `bytes` and is kept by the graph; the pinned buffer
                        // is read only after the replay's event has completed.
                        unsafe { side.copy_device_to_pinned(o.ptr(), pinned.as_ref(), *bytes)? };
                    }
                }
                Ok(())
            })
        });
        graph.host = host;
        if let Hook::Capture { keep, .. } = hook {
            graph.keep = keep;
        }
        graph.exec = Some(exec?);
        for o in outs {
            if !o.device().same(&device) {
                return Err(Error::InvalidArgument(
                    "graph capture: an output on another device".into(),
                ));
            }
            graph.outputs.push(StaticView {
                ptr: o.ptr(),
                shape: o.dims().to_vec(),
                strides: o.layout().strides.to_vec(),
                dtype: o.dtype(),
            });
            graph.keep.push(o);
        }
        graph.keep.extend(statics);
        Ok(graph)
    }

    fn replay(&self, inputs: &[&Tensor]) -> Result<Vec<Tensor>> {
        let exec = self.exec.as_deref().ok_or_else(|| Error::Backend {
            device: self.stream.device().name(),
            msg: "graph without an executable".into(),
        })?;
        // Held while the copies and the launch are queued (no wait): another thread on this
        // stream must not overwrite the static inputs between our copy-in and launch.
        let _queued_together = self.replay_lock.lock();
        for (t, st) in inputs.iter().zip(&self.inputs) {
            t.storage().prepare_use(&self.stream)?;
            let copy = Kernel::Copy {
                src: Strided {
                    ptr: t.ptr(),
                    strides: t.layout().strides.clone(),
                },
                shape: Dims::from_slice(&st.shape),
                out: st.ptr,
                elem_size: st.dtype.size(),
            };
            // SAFETY: `t` is alive and was prepared on this stream (its free guards cover the
            // read); the static input is pool memory of the right size, held by the graph.
            unsafe { self.stream.inner.launch(copy)? };
        }
        // SAFETY: every address the graph touches is pool memory or a kept tensor, alive as
        // long as the graph, and only this stream (in order) uses the pool.
        unsafe { self.stream.inner.launch_graph(exec)? };
        let mut outs = Vec::with_capacity(self.outputs.len());
        for o in &self.outputs {
            let spec = OutSpec {
                shape: Dims::from_slice(&o.shape),
                dtype: o.dtype,
            };
            let (ptr, strides, shape, elem_size) = (
                o.ptr,
                Dims::from_slice(&o.strides),
                Dims::from_slice(&o.shape),
                o.dtype.size(),
            );
            let out = launch_on(&self.stream, &[], spec, |p| Kernel::Copy {
                src: Strided { ptr, strides },
                shape,
                out: p,
                elem_size,
            })?;
            outs.push(out);
        }
        Ok(outs)
    }
}

impl Graph {
    /// One host-to-host replay; `None` when another call owns the graph's buffers.
    fn replay_host<T: Element>(&self, inputs: &[(&[T], &[usize])]) -> Result<Option<Vec<Vec<T>>>> {
        let (Some(io), Some(exec)) = (&self.host, self.exec.as_deref()) else {
            return Err(Error::InvalidArgument("graph: not a host graph".into()));
        };
        if self.outputs.iter().any(|o| o.dtype != T::DTYPE) || inputs.len() != io.inputs.len() {
            return Err(Error::InvalidArgument(
                "graph: inputs or outputs of another type".into(),
            ));
        }
        // Acquire pairs with the Release below: the last owner's reads are done.
        if io
            .busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return Ok(None);
        }
        for ((pinned, bytes), (data, _)) in io.inputs.iter().zip(inputs) {
            let src = as_bytes(data);
            if src.len() != *bytes {
                io.busy.store(false, Ordering::Release);
                return Err(Error::InvalidArgument(
                    "graph: input of another size".into(),
                ));
            }
            // SAFETY: the pinned buffer holds `bytes`; we own it (busy flag), and the previous
            // replay that read it has completed (its owner waited before releasing the flag).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), pinned.ptr(), *bytes) };
        }
        // SAFETY: the graph's memory is its pool, kept tensors and its pinned buffers, all
        // alive as long as the graph; only this stream, in order, uses them.
        let done = unsafe { self.stream.inner.launch_graph(exec) }
            .and_then(|()| self.stream.inner.record(false))
            .and_then(|e| e.synchronize());
        // On error the buffers may still be in use: the flag stays set (graph retired).
        done?;
        let outs = io
            .outputs
            .iter()
            .map(|(pinned, bytes)| {
                let mut v = vec![T::zeros_like(); bytes / T::DTYPE.size()];
                // SAFETY: the replay's copy into the pinned buffer has completed (event above).
                let src = unsafe { std::slice::from_raw_parts(pinned.ptr() as *const u8, *bytes) };
                as_bytes_mut(&mut v).copy_from_slice(src);
                v
            })
            .collect();
        io.busy.store(false, Ordering::Release);
        Ok(Some(outs))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        // Wait for the last replay before destroying the executable graph and giving the pool
        // back. Dropping happens at eviction or when the cache goes, never under its lock.
        let idle = self
            .stream
            .inner
            .record(false)
            .and_then(|e| e.synchronize());
        if let Err(e) = idle {
            tracing::error!(error = %e, "graph: could not wait for its last replay; leaking its pool");
            std::mem::forget(self.exec.take());
            return;
        }
        self.exec = None;
        hand_back(
            self.stream.device().allocator(),
            self.stream.index(),
            &self.stream.inner,
            self.pool.drain(..),
        );
    }
}

/// Gives a graph's pool blocks back to the allocator, each with a lazy guard on the graph's
/// stream `slot`: only that stream used the pool (replays and their copies), so stream order
/// covers reuse there, and another stream gets a block only after resolving the guard into
/// an event on `stream` and seeing it complete. (Modelled in `graph_loom_tests`.)
pub(crate) fn hand_back(
    allocator: &crate::allocator::CachingAllocator,
    slot: usize,
    stream: &Arc<dyn crate::backend::BackendStream>,
    pool: impl IntoIterator<Item = (DevicePtr, usize)>,
) {
    for (ptr, size) in pool {
        let block = Block {
            ptr,
            size,
            stream: slot,
        };
        // Cannot fail (the stream is at hand), but a leak would be said, not hidden.
        if let Err(e) = allocator.free_lazy(block, || Ok(stream.clone())) {
            tracing::error!(error = %e, "graph pool hand-back: leaking {size} bytes");
        }
    }
}
