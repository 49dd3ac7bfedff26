//! The request queue that callers push to and workers take batches from.
//!
//! **Continuous batching.** A worker that wants a batch takes the oldest waiting input and,
//! at once, every other waiting input of the same key (bucket) that fits: up to `rows`
//! inputs and `tokens` tokens, counted as `rows x longest` (or the sum of the inputs'
//! tokens for a model that packs; see [`Limits`]). Nothing waits
//! for more unless `max_wait` is set; then the worker keeps its partial batch open until it
//! is full or `max_wait` has passed since its first input (an opt-in window). One worker at a
//! time forms, so a window is not split over several half-empty batches.
//!
//! **Pipelined workers.** The preparing stage of a worker forms its next batch while the
//! running stage runs the current one. Formed too early, the next batch would hold whatever
//! single request had arrived, and every request arriving behind it would wait a whole extra
//! batch. So a preparing stage passes a [`Hold`]: it forms at once only while its runner is
//! idle, when a full batch is already waiting, or once its runner's batch has run for the
//! hold's `lead` (the expected forward time less the expected preparation time, so the next
//! batch is ready when the runner is). The runner reports its state through
//! [`RequestQueue::handed`], [`RequestQueue::started`] and [`RequestQueue::finished`], under
//! this queue's lock, so the hold waits on one condition variable for all of it.
//!
//! **Admission.** A push is a group of inputs (one client request) admitted all or none: the
//! caller's `admit` check sees the [`Load`] (requests, inputs, tokens waiting) under the same
//! lock as the push, so two pushes cannot both pass a limit only one fits in. A group counts
//! as one request until its last input leaves the queue.
//!
//! **Timed waits and loom.** Waiting for a first request is an untimed condvar wait. Only
//! the fill window and the hold's lead are timed, through `Condvar::wait_timeout`; under
//! `--cfg loom` that call releases the lock, lets other threads run and then reports a
//! timeout (loom has no clock), so in the model every timed wait ends after one round of
//! other threads. The code never branches on the clock outside those timeouts, so loom's
//! replays stay deterministic; a notification before the time is up re-runs the same loop.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use streampool::sync::{Condvar, Mutex};

/// One input as the queue sees it.
pub(crate) struct Item<T> {
    pub(crate) value: T,
    /// Inputs share a batch only with inputs of the same key (their bucket; 0 without).
    pub(crate) key: usize,
    /// Its tokens, at least 1.
    pub(crate) tokens: usize,
}

struct Entry<T> {
    item: Item<T>,
    /// The group it was pushed with, when the group had more than one input.
    group: Option<u64>,
}

/// What waits in the queue (not counting inputs taken into a batch).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Load {
    /// Groups with at least one input still waiting.
    pub(crate) requests: usize,
    /// Inputs waiting.
    pub(crate) inputs: usize,
    /// Tokens of the inputs waiting.
    pub(crate) tokens: usize,
}

/// Why a push was refused; the values come back so the caller can answer or re-route them.
pub(crate) enum PushError<T, E> {
    /// The `admit` check refused.
    Refused(Vec<T>, E),
    /// The queue was closed.
    Closed(Vec<T>),
}

/// The bounds of one batch.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most inputs.
    pub(crate) rows: usize,
    /// Most tokens, as `rows x longest input` (or, when `packed`, the sum of the inputs'
    /// tokens); one input over it still forms a batch alone.
    pub(crate) tokens: usize,
    /// The model runs a batch unpadded ([`crate::BatchModel::packs`]): a batch costs the sum
    /// of its inputs' tokens, not rows x the longest.
    pub(crate) packed: bool,
    /// The opt-in fill window (zero: none).
    pub(crate) max_wait: Duration,
}

/// A preparing stage's hold (see the module docs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hold {
    /// The worker whose runner the hold watches.
    pub(crate) worker: usize,
    /// Form once the runner's batch has run this long; `None` (not yet measured): only when
    /// the runner is idle or a full batch waits.
    pub(crate) lead: Option<Duration>,
}

/// A pipelined worker's running stage, as its preparing stage's hold sees it.
#[derive(Debug, Clone, Copy, Default)]
struct Runner {
    /// Batches handed to it (put in its hand-off) and not finished: 0 means idle.
    pending: usize,
    /// When its current batch started (or was handed over, until it starts).
    since: Option<Instant>,
}

struct State<T> {
    items: VecDeque<Entry<T>>,
    load: Load,
    /// Inputs still waiting per multi-input group.
    groups: HashMap<u64, usize>,
    next_group: u64,
    closed: bool,
    /// A worker is forming a batch (between its first take and the end of its window).
    forming: bool,
    /// One per worker (only pipelined workers report).
    runners: Vec<Runner>,
}

impl<T> State<T> {
    /// Removes the entry at `index` and updates the load.
    fn take(&mut self, index: usize) -> Item<T> {
        // In range: every caller indexes an entry it just looked at, under the same lock.
        let e = self.items.remove(index).expect("index in range");
        self.load.inputs -= 1;
        self.load.tokens -= e.item.tokens;
        let last_of_group = match e.group {
            None => true,
            Some(g) => match self.groups.get_mut(&g) {
                Some(left) if *left > 1 => {
                    *left -= 1;
                    false
                }
                _ => {
                    self.groups.remove(&g);
                    true
                }
            },
        };
        if last_of_group {
            self.load.requests -= 1;
        }
        e.item
    }
}

/// A FIFO of requests, closed once at shutdown; limits are the pusher's `admit` check.
pub(crate) struct RequestQueue<T> {
    /// Protects the items, the load, the flags and the runners' states. Held to push, to move
    /// items into a forming batch, to report a runner's state and while waiting on
    /// `changed`; never while a batch is prepared or runs.
    state: Mutex<State<T>>,
    /// Notified on every push, on close, when a worker stops forming, and when a runner goes
    /// idle.
    changed: Condvar,
}

impl<T> RequestQueue<T> {
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                load: Load::default(),
                groups: HashMap::new(),
                next_group: 0,
                closed: false,
                forming: false,
                runners: vec![Runner::default(); workers],
            }),
            changed: Condvar::new(),
        }
    }

    /// Appends `items` as one group if `admit` accepts the load waiting now, or gives them
    /// back at once (never blocks beyond the brief lock). `admit` runs under the queue's lock:
    /// it must not take it.
    pub(crate) fn push_group<E>(
        &self,
        items: Vec<Item<T>>,
        admit: impl FnOnce(Load) -> Result<(), E>,
    ) -> Result<(), PushError<T, E>> {
        let n = items.len();
        if n == 0 {
            return Ok(());
        }
        let values = |items: Vec<Item<T>>| items.into_iter().map(|i| i.value).collect();
        {
            let mut st = self.state.lock();
            if st.closed {
                return Err(PushError::Closed(values(items)));
            }
            if let Err(e) = admit(st.load) {
                return Err(PushError::Refused(values(items), e));
            }
            let group = (n > 1).then(|| {
                let g = st.next_group;
                st.next_group += 1;
                st.groups.insert(g, n);
                g
            });
            st.load.requests += 1;
            st.load.inputs += n;
            for item in items {
                st.load.tokens += item.tokens;
                st.items.push_back(Entry { item, group });
            }
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Waits for a batch within `limits` (see the module docs; `hold` for a preparing stage).
    /// Returns `None` once the queue is closed and empty.
    pub(crate) fn take_batch(&self, limits: Limits, hold: Option<Hold>) -> Option<Vec<T>> {
        let mut st = self.state.lock();
        let mut lead_passed = false;
        loop {
            if st.closed && st.items.is_empty() {
                return None;
            }
            if st.forming || st.items.is_empty() {
                st = self.changed.wait(st);
                continue;
            }
            let Some(hold) = hold else { break };
            let runner = st.runners.get(hold.worker).copied().unwrap_or_default();
            if st.closed || lead_passed || runner.pending == 0 {
                break;
            }
            if full_batch_waiting(&st.items, limits) {
                break;
            }
            match (hold.lead, runner.since) {
                (Some(lead), Some(since)) => {
                    let left = (since + lead).saturating_duration_since(Instant::now());
                    let (guard, timed_out) = self.changed.wait_timeout(&self.state, st, left);
                    st = guard;
                    // Trusted as "the lead has passed" without re-reading the clock (see the
                    // module docs on loom).
                    lead_passed = timed_out;
                }
                _ => st = self.changed.wait(st),
            }
        }
        st.forming = true;
        let first = st.take(0);
        let key = first.key;
        let mut batch = Forming::new(first);
        let window_end = (!limits.max_wait.is_zero()).then(|| Instant::now() + limits.max_wait);
        loop {
            let full = take_matching(&mut st, &mut batch, key, limits);
            if full || st.closed {
                break;
            }
            let Some(end) = window_end else { break };
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let (guard, timed_out) = self.changed.wait_timeout(&self.state, st, left);
            st = guard;
            if timed_out {
                take_matching(&mut st, &mut batch, key, limits);
                break;
            }
        }
        st.forming = false;
        let others_waiting = !st.items.is_empty();
        drop(st);
        if others_waiting {
            // Requests of other buckets (or beyond the limits) are waiting: let the next
            // worker form.
            self.changed.notify_all();
        }
        Some(batch.values)
    }

    /// A preparing stage hands a batch to `worker`'s runner (call before the hand-off's put,
    /// so the runner never looks idle while a batch is on its way to it).
    pub(crate) fn handed(&self, worker: usize, now: Instant) {
        let mut st = self.state.lock();
        if let Some(r) = st.runners.get_mut(worker) {
            r.pending += 1;
            r.since = Some(now);
        }
    }

    /// `worker`'s runner started the batch handed to it.
    pub(crate) fn started(&self, worker: usize, now: Instant) {
        if let Some(r) = self.state.lock().runners.get_mut(worker) {
            r.since = Some(now);
        }
    }

    /// `worker`'s runner finished a batch handed to it (or will never run it): when it has
    /// nothing left, its preparing stage may form at once.
    pub(crate) fn finished(&self, worker: usize) {
        let idle = {
            let mut st = self.state.lock();
            match st.runners.get_mut(worker) {
                Some(r) => {
                    r.pending = r.pending.saturating_sub(1);
                    r.pending == 0
                }
                None => false,
            }
        };
        if idle {
            self.changed.notify_all();
        }
    }

    /// Closes the queue: later pushes fail with [`PushError::Closed`]. With `drain`, waiting
    /// items stay for the workers to run and nothing is returned; without, they are removed
    /// and returned for the caller to answer.
    pub(crate) fn close(&self, drain: bool) -> Vec<T> {
        let removed = {
            let mut st = self.state.lock();
            st.closed = true;
            if drain {
                Vec::new()
            } else {
                st.load = Load::default();
                st.groups.clear();
                st.items.drain(..).map(|e| e.item.value).collect()
            }
        };
        self.changed.notify_all();
        removed
    }

    /// Whether [`RequestQueue::close`] was called.
    pub(crate) fn is_closed(&self) -> bool {
        self.state.lock().closed
    }

    /// What waits now.
    pub(crate) fn load(&self) -> Load {
        self.state.lock().load
    }
}

/// A batch being formed: its values and its inputs' tokens.
struct Forming<T> {
    values: Vec<T>,
    size: Size,
}

impl<T> Forming<T> {
    fn new(first: Item<T>) -> Self {
        Self {
            size: Size::default().with(first.tokens),
            values: vec![first.value],
        }
    }

    fn push(&mut self, item: Item<T>) {
        self.size = self.size.with(item.tokens);
        self.values.push(item.value);
    }
}

/// A batch's rows, longest input and total tokens, for the token budget.
#[derive(Debug, Clone, Copy, Default)]
struct Size {
    rows: usize,
    longest: usize,
    total: usize,
}

impl Size {
    fn with(self, tokens: usize) -> Self {
        Self {
            rows: self.rows + 1,
            longest: self.longest.max(tokens),
            total: self.total.saturating_add(tokens),
        }
    }

    /// Its cost against the budget: rows x longest (padded), or the tokens (packed).
    fn cost(&self, packed: bool) -> usize {
        if packed {
            self.total
        } else {
            self.rows.saturating_mul(self.longest)
        }
    }
}

/// Whether one more input of `tokens` fits a batch of `size`: the first input always does
/// (an over-long one runs alone).
fn fits(size: Size, tokens: usize, limits: Limits) -> bool {
    size.rows == 0 || size.with(tokens).cost(limits.packed) <= limits.tokens
}

/// Moves waiting items with key `key` into `batch`, oldest first, until the batch is full;
/// returns whether it is (at `rows`, or the next matching item does not fit the token
/// budget: it is left for the next batch rather than skipped, so a long input is not passed
/// over by shorter ones behind it).
fn take_matching<T>(st: &mut State<T>, batch: &mut Forming<T>, key: usize, limits: Limits) -> bool {
    let mut i = 0;
    while batch.values.len() < limits.rows && i < st.items.len() {
        let item = &st.items[i].item;
        if item.key != key {
            i += 1;
            continue;
        }
        if !fits(batch.size, item.tokens, limits) {
            return true;
        }
        let item = st.take(i);
        batch.push(item);
    }
    batch.values.len() >= limits.rows
}

/// Whether a whole batch (by `limits`) of the oldest item's key is already waiting. Looks at
/// a bounded prefix of the queue, so a hold re-checking on every push stays cheap; beyond it
/// the hold just waits for its runner or its lead.
fn full_batch_waiting<T>(items: &VecDeque<Entry<T>>, limits: Limits) -> bool {
    let Some(first) = items.front() else {
        return false;
    };
    let key = first.item.key;
    let mut size = Size::default();
    for e in items
        .iter()
        .take(limits.rows.saturating_mul(4))
        .filter(|e| e.item.key == key)
    {
        if !fits(size, e.item.tokens, limits) {
            return true;
        }
        size = size.with(e.item.tokens);
        if size.rows >= limits.rows {
            return true;
        }
    }
    false
}
