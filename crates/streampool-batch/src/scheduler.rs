//! Sharing one device between the batch queues of several models: which queue's batch runs
//! next.
//!
//! Every queue on a device asks that device's [`DeviceScheduler`] for a *turn* before a batch
//! runs and gives it back when the forward returns. The policy:
//!
//! - **Classes first.** A [`Priority::High`] batch (a latency-critical model) never waits for
//!   a turn: it starts at once, whatever else runs. A waiting [`Priority::Normal`] batch is
//!   granted before any waiting [`Priority::Low`] one.
//! - **Slots.** Batches of the other classes start only while fewer than `slots` batches of
//!   any class are in flight on the device: the most workers of any one queue on it (at
//!   least 2), so a model alone keeps every worker busy as before, while several models
//!   together keep no deeper a queue of bulk work than one of them would, and a
//!   latency-critical batch never finds many bulk batches ahead of it. Its own kernels then go to
//!   high-priority streams ([`Device::high_priority_stream`](streampool::Device::high_priority_stream)),
//!   whose blocks the GPU dispatches before the bulk batches' pending blocks.
//! - **Weighted token share within a class.** Among waiting batches of one class the one
//!   with the smallest *virtual start* goes first (start-time fair queueing): each queue's
//!   virtual time advances by `tokens / weight` per batch it runs, and a queue that was idle
//!   starts from the device's current virtual time (it banks no credit while idle). Two
//!   saturating queues of weights 3 and 1 get about 3/4 and 1/4 of the device's tokens. A
//!   queue counts as idle whenever none of its batches waits for a turn (the device is never
//!   held for it): weights share a device whose queues keep batches waiting.
//!
//! A turn is a counted permit, not a lock: the scheduler's mutex is held only to update the
//! counts and pick a waiter, never while a batch runs. Waiters block on a condition variable
//! (batch workers are OS threads); every release wakes them all and each re-checks whether
//! it is now the one to go (few waiters: at most one per worker on the device). The state
//! goes through `streampool::sync`, so the loom model checks the hand-off over every
//! interleaving (`loom_tests.rs`).

use std::collections::HashMap;
use std::fmt;

use streampool::sync::{Arc, Condvar, Mutex};

/// A model's scheduling class on its device (see the module docs of
/// [`DeviceScheduler`]).
///
/// ```
/// use streampool_batch::Priority;
/// assert!(Priority::High > Priority::Normal && Priority::Normal > Priority::Low);
/// assert_eq!("high".parse::<Priority>().unwrap(), Priority::High);
/// assert!("urgent".parse::<Priority>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Priority {
    /// Bulk work: runs when no normal batch waits.
    Low,
    /// The default.
    #[default]
    Normal,
    /// Latency-critical: never waits for a turn, and runs on high-priority streams.
    High,
}

impl Priority {
    /// The name used in settings and metrics: `low`, `normal`, `high`.
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::Low => "low",
            Priority::Normal => "normal",
            Priority::High => "high",
        }
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Priority {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "low" | "batch" => Ok(Priority::Low),
            "normal" => Ok(Priority::Normal),
            "high" | "latency" => Ok(Priority::High),
            _ => Err(format!(
                "unknown priority {s:?}: expected high, normal or low"
            )),
        }
    }
}

/// One queue's standing with its device's scheduler: its class, its weight and its
/// virtual time. Created by [`DeviceScheduler::share`].
pub struct Share {
    scheduler: Arc<DeviceScheduler>,
    id: u64,
    priority: Priority,
    weight: u32,
}

impl Share {
    /// The class its batches run in.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Blocks until a batch of `tokens` may run, and returns the turn (given back when
    /// dropped). A [`Priority::High`] share never blocks.
    pub fn turn(&self, tokens: usize) -> Turn<'_> {
        self.scheduler.acquire(self, tokens);
        Turn { share: self }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        self.scheduler.state.lock().finish.remove(&self.id);
    }
}

impl fmt::Debug for Share {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Share")
            .field("priority", &self.priority)
            .field("weight", &self.weight)
            .finish()
    }
}

/// A batch's turn on the device; dropping it lets the next batch go.
#[must_use = "the turn ends when dropped"]
pub struct Turn<'a> {
    share: &'a Share,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.share.scheduler.release(self.share.priority);
    }
}

struct Waiter {
    ticket: u64,
    priority: Priority,
    start: f64,
}

struct State {
    /// Batches of the normal and low classes allowed in flight (see the module docs).
    slots: usize,
    /// Batches in flight, all classes.
    running: usize,
    /// Waiting batches (at most one per worker thread of the device's queues).
    waiting: Vec<Waiter>,
    next_ticket: u64,
    next_share: u64,
    /// The device's virtual time: the largest virtual start granted so far.
    now: f64,
    /// Each share's virtual finish time (where its next batch's virtual start begins).
    finish: HashMap<u64, f64>,
    /// Batches granted per class, for the statistics: low, normal, high.
    granted: [u64; 3],
    /// Batches that had to wait for their turn, per class.
    waited: [u64; 3],
}

/// The turn-taking of every batch queue on one device (see the module docs).
///
/// ```
/// use streampool_batch::{DeviceScheduler, Priority};
/// let scheduler = DeviceScheduler::new(1);
/// let bulk = scheduler.share(Priority::Low, 1);
/// let urgent = scheduler.share(Priority::High, 1);
/// let running = bulk.turn(512);
/// // The only slot is taken, yet a latency-critical batch starts at once.
/// let now = urgent.turn(8);
/// drop((running, now));
/// assert_eq!(scheduler.stats().granted, [1, 0, 1]);
/// ```
pub struct DeviceScheduler {
    /// Protects the counts, the waiters and the virtual times; held only to update them
    /// and pick who goes, never while a batch runs.
    state: Mutex<State>,
    /// Notified when a turn ends (a waiter may now go).
    released: Condvar,
}

/// What a [`DeviceScheduler`] has done: batches granted a turn and batches that waited,
/// per class (`[low, normal, high]`), and batches in flight now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchedulerStats {
    /// Turns granted per class: `[low, normal, high]`.
    pub granted: [u64; 3],
    /// Turns that waited for a slot or a higher class, per class.
    pub waited: [u64; 3],
    /// Batches in flight now.
    pub running: usize,
}

impl DeviceScheduler {
    /// A scheduler letting at most `slots` (>= 1) batches of the normal and low classes be in
    /// flight at once (high-class batches never wait).
    pub fn new(slots: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                slots: slots.max(1),
                running: 0,
                waiting: Vec::new(),
                next_ticket: 0,
                next_share: 0,
                now: 0.0,
                finish: HashMap::new(),
                granted: [0; 3],
                waited: [0; 3],
            }),
            released: Condvar::new(),
        })
    }

    /// The scheduler every queue on `device` shares, created on first use with `slots`
    /// slots; a later caller asking for more raises it (a queue of more workers than the
    /// others). Kept while any queue of the device holds it.
    ///
    /// ```
    /// use streampool::Device;
    /// use streampool_batch::DeviceScheduler;
    /// let dev = Device::cpu();
    /// let a = DeviceScheduler::for_device(&dev, 2);
    /// let b = DeviceScheduler::for_device(&dev, 4);
    /// assert!(std::sync::Arc::ptr_eq(&a, &b));
    /// assert_eq!(a.slots(), 4);
    /// ```
    pub fn for_device(device: &streampool::Device, slots: usize) -> Arc<Self> {
        static DEVICES: std::sync::OnceLock<
            parking_lot::Mutex<HashMap<u64, std::sync::Weak<DeviceScheduler>>>,
        > = std::sync::OnceLock::new();
        // Held only to find or insert one entry.
        let mut map = DEVICES.get_or_init(Default::default).lock();
        map.retain(|_, w| w.strong_count() > 0);
        if let Some(s) = map.get(&device.id()).and_then(std::sync::Weak::upgrade) {
            s.raise_slots(slots);
            return s;
        }
        let s = Self::new(slots);
        map.insert(device.id(), Arc::downgrade(&s));
        s
    }

    /// Batches of the normal and low classes that may be in flight at once.
    pub fn slots(&self) -> usize {
        self.state.lock().slots
    }

    /// Raises the slots to at least `slots`.
    fn raise_slots(&self, slots: usize) {
        let mut st = self.state.lock();
        st.slots = st.slots.max(slots);
        drop(st);
        self.released.notify_all();
    }

    /// A new queue's share: its class and its weight (>= 1; larger gets a larger share of
    /// the device's tokens within its class).
    pub fn share(self: &Arc<Self>, priority: Priority, weight: u32) -> Share {
        let mut st = self.state.lock();
        let id = st.next_share;
        st.next_share += 1;
        drop(st);
        Share {
            scheduler: self.clone(),
            id,
            priority,
            weight: weight.max(1),
        }
    }

    /// What it has done so far.
    pub fn stats(&self) -> SchedulerStats {
        let st = self.state.lock();
        SchedulerStats {
            granted: st.granted,
            waited: st.waited,
            running: st.running,
        }
    }

    fn acquire(&self, share: &Share, tokens: usize) {
        let class = share.priority as usize;
        let mut st = self.state.lock();
        // Start-time fair queueing: an idle share resumes at the device's virtual time.
        let start = st.finish.get(&share.id).copied().unwrap_or(0.0).max(st.now);
        let cost = tokens.max(1) as f64 / f64::from(share.weight);
        let grant = |st: &mut State| {
            st.running += 1;
            st.granted[class] += 1;
            st.now = st.now.max(start);
            st.finish.insert(share.id, start + cost);
        };
        if share.priority == Priority::High {
            grant(&mut st);
            return;
        }
        if st.running < st.slots && st.waiting.is_empty() {
            grant(&mut st);
            return;
        }
        let ticket = st.next_ticket;
        st.next_ticket += 1;
        st.waiting.push(Waiter {
            ticket,
            priority: share.priority,
            start,
        });
        st.waited[class] += 1;
        loop {
            if st.running < st.slots && first(&st.waiting) == Some(ticket) {
                st.waiting.retain(|w| w.ticket != ticket);
                grant(&mut st);
                // Another slot may be free for the next waiter.
                self.released.notify_all();
                return;
            }
            st = self.released.wait(st);
        }
    }

    fn release(&self, _priority: Priority) {
        let mut st = self.state.lock();
        st.running -= 1;
        drop(st);
        self.released.notify_all();
    }
}

/// The waiter to go next: the highest class, then the smallest virtual start, then the
/// earliest.
fn first(waiting: &[Waiter]) -> Option<u64> {
    waiting
        .iter()
        .min_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.start.total_cmp(&b.start))
                .then(a.ticket.cmp(&b.ticket))
        })
        .map(|w| w.ticket)
}

impl fmt::Debug for DeviceScheduler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DeviceScheduler")
            .field("slots", &self.slots())
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::mpsc;
    use std::time::Duration;

    use super::*;

    /// Waits until `n` batches wait for their turn.
    fn until_waiting(s: &DeviceScheduler, n: usize) {
        for _ in 0..2000 {
            if s.state.lock().waiting.len() == n {
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{n} waiters never showed up");
    }

    #[test]
    fn a_waiting_normal_batch_goes_before_earlier_low_ones() {
        let s = DeviceScheduler::new(1);
        let (low, normal) = (s.share(Priority::Low, 1), s.share(Priority::Normal, 1));
        let (tx, rx) = mpsc::channel();
        let running = low.turn(100);
        std::thread::scope(|scope| {
            let (low, tx2) = (&low, tx.clone());
            scope.spawn(move || {
                let _t = low.turn(100);
                tx2.send("low").unwrap();
            });
            until_waiting(&s, 1);
            let (normal, tx3) = (&normal, tx.clone());
            scope.spawn(move || {
                let _t = normal.turn(100);
                tx3.send("normal").unwrap();
            });
            until_waiting(&s, 2);
            drop(running);
        });
        let order: Vec<_> = rx.try_iter().collect();
        assert_eq!(order, ["normal", "low"]);
        assert_eq!(s.stats().waited, [1, 1, 0]);
    }

    #[test]
    fn high_batches_never_wait_and_count_against_the_slots() {
        let s = DeviceScheduler::new(2);
        let (high, normal) = (s.share(Priority::High, 1), s.share(Priority::Normal, 1));
        let a = high.turn(1);
        let b = high.turn(1);
        let c = high.turn(1);
        assert_eq!(s.stats().running, 3);
        // Slots are full of high batches: a normal one waits until one ends.
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| drop(normal.turn(1)));
            until_waiting(&s, 1);
            drop(a);
            drop(b);
            waiter.join().unwrap();
        });
        drop(c);
        assert_eq!(s.stats().running, 0);
    }

    #[test]
    fn weights_share_the_tokens_of_a_saturated_device() {
        // One slot, two queues of two workers each, so each queue has a batch waiting while
        // its other one runs: weight 3 gets ~3/4 of the turns (equal batch sizes). (A queue
        // with nothing waiting when a turn ends is idle: the turn goes to whoever waits.)
        let s = DeviceScheduler::new(1);
        let heavy = s.share(Priority::Normal, 3);
        let light = s.share(Priority::Normal, 1);
        let counts = Mutex::new([0usize; 2]);
        let stop = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|scope| {
            for (i, share) in [&heavy, &heavy, &light, &light].into_iter().enumerate() {
                let i = i / 2;
                let (counts, stop) = (&counts, &stop);
                scope.spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let _t = share.turn(64);
                        counts.lock()[i] += 1;
                        std::thread::sleep(Duration::from_micros(200));
                    }
                });
            }
            std::thread::sleep(Duration::from_millis(400));
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        });
        let [h, l] = *counts.lock();
        let share = h as f64 / (h + l) as f64;
        assert!((0.6..0.9).contains(&share), "heavy got {h}, light {l}");
    }

    #[test]
    fn queues_on_one_device_share_its_scheduler() {
        use crate::{BatchConfig, BatchQueue, RowModel};
        use streampool::{Device, DeviceConfig, Tensor};
        let dev = Device::cpu_with(DeviceConfig::default()).unwrap();
        let queue = |priority| {
            let w = Tensor::randn(&[4, 3], 7, &dev).unwrap();
            let model = RowModel::new(dev.clone(), 4, move |x: &Tensor| x.matmul(&w));
            let config = BatchConfig {
                priority,
                ..BatchConfig::default()
            };
            BatchQueue::new(model, config).unwrap()
        };
        let (high, low) = (queue(Priority::High), queue(Priority::Low));
        for _ in 0..3 {
            high.infer(vec![1.0; 4]).unwrap();
        }
        low.infer(vec![1.0; 4]).unwrap();
        let s = DeviceScheduler::for_device(&dev, 1).stats();
        assert_eq!((s.granted[2], s.granted[0]), (3, 1));
        assert_eq!(s.running, 0);
    }

    #[test]
    fn an_idle_queue_banks_no_credit() {
        let s = DeviceScheduler::new(1);
        let busy = s.share(Priority::Normal, 1);
        let idle = s.share(Priority::Normal, 1);
        for _ in 0..10 {
            drop(busy.turn(100));
        }
        // The idle share starts at the device's virtual time, not at zero.
        let st = s.state.lock();
        let now = st.now;
        assert!(now >= 900.0, "{now}");
        assert!(!st.finish.contains_key(&idle.id));
    }
}
