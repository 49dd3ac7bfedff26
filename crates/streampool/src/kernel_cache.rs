//! A thread-safe build-once cache for compiled kernels (NVRTC modules, Metal pipelines).

use std::collections::HashMap;
use std::hash::Hash;

use crate::sync::{Arc, Mutex};
use crate::Result;

/// One key's value, filled by the first build.
type Slot<V> = Arc<Mutex<Option<Arc<V>>>>;

/// Builds each value once per key and shares it with every thread. Concurrent callers of
/// the same key wait for the one build in progress instead of compiling again; callers of
/// other keys are not held up. A failed build is not cached, so a later call retries.
///
/// ```
/// use streampool::KernelCache;
/// let cache: KernelCache<&str, String> = KernelCache::new();
/// let k = cache.get_or_build("relu", || Ok("compiled relu".to_string())).unwrap();
/// assert_eq!(*k, "compiled relu");
/// assert_eq!(cache.builds(), 1);
/// ```
pub struct KernelCache<K, V> {
    /// Held only to find or insert a key's slot.
    slots: Mutex<HashMap<K, Slot<V>>>,
    builds: Mutex<u64>,
}

impl<K: Eq + Hash + Clone, V> Default for KernelCache<K, V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<K: Eq + Hash + Clone, V> KernelCache<K, V> {
    /// An empty cache.
    pub fn new() -> Self {
        Self {
            slots: Mutex::new(HashMap::new()),
            builds: Mutex::new(0),
        }
    }

    /// The value for `key`, building it with `build` if no thread has yet.
    pub fn get_or_build(&self, key: K, build: impl FnOnce() -> Result<V>) -> Result<Arc<V>> {
        let slot = self.slots.lock().entry(key).or_default().clone();
        // The slot lock is held across the build on purpose: it is what makes concurrent
        // callers of this key wait for the single build. It is never held across a GPU wait.
        let mut value = slot.lock();
        if let Some(v) = value.as_ref() {
            return Ok(v.clone());
        }
        let built = Arc::new(build()?);
        *self.builds.lock() += 1;
        *value = Some(built.clone());
        Ok(built)
    }

    /// Number of successful builds so far.
    pub fn builds(&self) -> u64 {
        *self.builds.lock()
    }
}
