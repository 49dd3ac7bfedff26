//! The one-batch hand-off between a pipelined worker's two stages (see
//! [`BatchModel::prepares`](crate::BatchModel::prepares)).
//!
//! The preparing stage waits until the slot is vacant, then forms and prepares the next batch
//! and puts it in; the running stage takes it and runs it. Waiting for a vacant slot
//! *before* forming keeps requests in the queue (where deadlines, cancellation and the
//! `max_queue` bound apply) until the runner can take another batch: at most one batch is
//! running and one prepared or being prepared per worker, and the next batch is formed from
//! what arrived while the current one ran.
//!
//! Either side may close the hand-off: the preparer when the queue is closed and drained, the
//! runner when it stops (by [`Handoff::close`] from a drop guard, so a runner that died would
//! not leave the preparer blocked for ever). A `put` after close gives its batch back; the
//! caller drops it, and each request's dropped responder answers `ShutDown`, so every request
//! is still answered exactly once.

use streampool::sync::{Condvar, Mutex};

struct State<T> {
    item: Option<T>,
    closed: bool,
}

/// A one-item slot between one producer and one consumer.
pub(crate) struct Handoff<T> {
    /// Protects the item and the closed flag; held only to move the item or read the flag,
    /// never while a batch is formed, prepared or run.
    state: Mutex<State<T>>,
    /// Notified on every put, take and close.
    changed: Condvar,
}

impl<T> Handoff<T> {
    pub(crate) fn new() -> Self {
        Self {
            state: Mutex::new(State {
                item: None,
                closed: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// Blocks until the slot is empty; `false` if the hand-off was closed instead.
    pub(crate) fn wait_vacant(&self) -> bool {
        let mut st = self.state.lock();
        loop {
            if st.closed {
                return false;
            }
            if st.item.is_none() {
                return true;
            }
            st = self.changed.wait(st);
        }
    }

    /// Puts `item` in the slot, blocking while another item is there; gives it back if the
    /// hand-off is (or gets) closed.
    pub(crate) fn put(&self, item: T) -> Result<(), T> {
        {
            let mut st = self.state.lock();
            loop {
                if st.closed {
                    return Err(item);
                }
                if st.item.is_none() {
                    break;
                }
                st = self.changed.wait(st);
            }
            st.item = Some(item);
        }
        self.changed.notify_all();
        Ok(())
    }

    /// Takes the item, blocking until there is one; `None` once closed and empty (an item put
    /// before the close is still taken).
    pub(crate) fn take(&self) -> Option<T> {
        let item = {
            let mut st = self.state.lock();
            loop {
                if let Some(item) = st.item.take() {
                    break item;
                }
                if st.closed {
                    return None;
                }
                st = self.changed.wait(st);
            }
        };
        self.changed.notify_all();
        Some(item)
    }

    /// Closes the hand-off: later puts fail and `take` returns `None` once the slot is empty.
    /// Returns the item still in the slot, if any, for a closing runner to answer.
    pub(crate) fn close(&self) -> Option<T> {
        let left = {
            let mut st = self.state.lock();
            st.closed = true;
            st.item.take()
        };
        self.changed.notify_all();
        left
    }

    /// Closes for the producer side only: `take` still returns the item left in the slot.
    pub(crate) fn finish(&self) {
        self.state.lock().closed = true;
        self.changed.notify_all();
    }
}
