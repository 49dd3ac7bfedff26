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
//! from its trace; or a call of the moment the driver forbids during a capture) is tried
//! again at the key's next sightings, and after [`CAPTURE_TRIES`] failures marks the key
//! eager. At most `capacity` keys are kept; the least recently
//! used is evicted, and its graph, once its last replay has completed, gives its pool back.

mod capture;
mod pool;

#[cfg(all(loom, test))]
pub(crate) use pool::hand_back;
pub(crate) use pool::{alloc, note_inputs};

use std::collections::HashMap;

use crate::sync::{Arc, Mutex};
use crate::{DType, Device, Element, Error, Result, Tensor};
use capture::Graph;
use pool::{with_hook, Hook};

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
    /// Captures of this key that failed so far (see [`CAPTURE_TRIES`]).
    failures: u32,
}

/// Captures of one key tried before it runs eagerly for good. A capture can fail for a
/// reason of the moment (another thread's call that the driver forbids during a capture, a
/// full graph pool) as well as for good (the closure does something a graph cannot hold):
/// one failure must not cost a shape its graph for the life of the process.
const CAPTURE_TRIES: u32 = 3;

impl Trace {
    /// The slot after a failed capture of this trace: seen again (captured at a later
    /// sighting) until [`CAPTURE_TRIES`] have failed, then eager.
    fn after_failure(&self) -> Slot {
        if self.failures + 1 >= CAPTURE_TRIES {
            Slot::Eager
        } else {
            Slot::Seen(Trace {
                failures: self.failures + 1,
                ..self.clone()
            })
        }
    }
}

enum Slot {
    /// Seen once: what that eager run allocated.
    Seen(Trace),
    Ready(Arc<Graph>),
    /// Capture failed [`CAPTURE_TRIES`] times: always eager.
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

/// The default memory budget of a [`GraphCache`]'s graphs: 4 GiB.
pub const DEFAULT_GRAPH_MEMORY: usize = 4 << 30;

/// Graph statistics of a [`GraphCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Keys with a captured graph.
    pub graphs: usize,
    /// Keys seen once (eager, traced).
    pub seen: usize,
    /// Keys that run eagerly for good: the capture failed [`CAPTURE_TRIES`] times, or the
    /// shape is over the memory budget's limit for one graph.
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
    /// A cache keeping at most `capacity` keys (at least 1). Graphs are on unless the
    /// process's tunables turn them off (`graph.enabled`, `STREAMPOOL_GRAPHS=0`: every call
    /// eager, to compare; [`crate::config`]).
    ///
    /// The graphs' pools together hold at most the tunables' `graph.max_bytes`
    /// ([`DEFAULT_GRAPH_MEMORY`] unless `STREAMPOOL_GRAPH_MEMORY_MB` says otherwise; see
    /// [`GraphCache::with_max_bytes`]).
    pub fn new(capacity: usize) -> Self {
        let tuning = &crate::config::tuning().graph;
        Self {
            capacity: capacity.max(1),
            max_bytes: tuning.max_bytes,
            enabled: tuning.enabled,
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
                // Timed (`crate::phases`): a shape's first call, eager (plans, tuning and new
                // allocations happen here).
                let (out, hook) = crate::phases::timed("graph: first call (eager)", || {
                    with_hook(hook, || f(&owned))
                });
                let out = out?;
                if let Hook::Trace { sizes, .. } = hook {
                    let out_bytes = Vec::new();
                    self.insert(
                        key,
                        Slot::Seen(Trace {
                            sizes,
                            out_bytes,
                            failures: 0,
                        }),
                    );
                }
                Ok(out)
            }
            Action::Capture(trace) => match crate::phases::timed("graph capture", || {
                Graph::capture(&stream, &trace.sizes, inputs, None, &f)
            }) {
                Ok(g) => {
                    let g = Arc::new(g);
                    self.insert(key, Slot::Ready(g.clone()));
                    Ok(g.replay(inputs)?)
                }
                Err(e) => {
                    tracing::warn!(error = %e, name, tries = trace.failures + 1,
                        "graph capture failed; running eagerly");
                    self.insert(key, trace.after_failure());
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
                    self.insert(
                        key,
                        Slot::Seen(Trace {
                            sizes,
                            out_bytes,
                            failures: 0,
                        }),
                    );
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
                        tracing::warn!(error = %e, name, tries = trace.failures + 1,
                            "graph capture failed; running eagerly");
                        self.insert(key, trace.after_failure());
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
