//! The process's tokenization pool: one set of host threads, sized to the machine, that every
//! embedder, batch worker and server request tokenizes on.
//!
//! ## Why one pool, and how it meets the other threads of the process
//! - **One per process.** Tokenizing is pure CPU work with no waiting, so more threads than
//!   cores only adds switching. A pool per embedder or per batch worker would multiply the
//!   threads by the number of models or workers; one shared pool keeps them at the core count
//!   however many callers there are, and rayon's work stealing spreads one large batch over
//!   every idle thread while small requests from many callers interleave.
//! - **A named rayon pool, not rayon's global one.** Its threads are named
//!   `streampool-tok-N` (visible in a profiler), its size is ours to set
//!   (`STREAMPOOL_TOKENIZE_THREADS`), and an application's own use of rayon's global pool
//!   neither resizes it nor queues behind it. `tokenizers`' own `encode_batch`
//!   parallelism (`into_maybe_par_iter`) runs on whatever pool it is called from, so called
//!   through [`TokenizePool::install`] it also stays on these threads.
//! - **CPU backend stream threads.** Each CPU stream is one worker thread draining its queue
//!   (`streampool::cpu`); it never calls into this pool and this pool never waits for a
//!   stream, so there is no cycle to deadlock on. While a chunk's forward runs on a CPU
//!   stream and the next chunk tokenizes here, the process has cores + 1 busy threads for
//!   that overlap; on a GPU device the stream threads only queue work and mostly sleep.
//! - **A future intra-op pool** (one CPU call using every core) should be this same pool,
//!   not a second one sized to the cores: two full-size pools busy at once would run twice
//!   as many threads as cores. Then the rule that keeps it deadlock-free is the one this
//!   module already follows: a pool job never blocks on work that needs a pool thread (a
//!   stream read-back, a lock held by a caller waiting on the pool). Tokenization jobs hold
//!   no locks and wait for nothing but their own sub-jobs (rayon `join`, which steals work
//!   while it waits).
//! - **Called from inside a pool thread.** [`TokenizePool::install`] from one of this pool's
//!   threads runs inline (rayon's rule), so a server job that tokenizes a large request with
//!   nested parallelism cannot deadlock on itself. From a thread of another rayon pool, that
//!   thread keeps executing its own pool's jobs while it waits (rayon's cross-pool install).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::OnceLock;

use rayon::prelude::*;

use crate::{Error, Result};

/// A pool of host threads for tokenization. [`TokenizePool::global`] is the one the library
/// uses; [`TokenizePool::new`] builds others (tests, or an application that wants a smaller
/// share of the cores).
///
/// ```
/// use streampool_nn::TokenizePool;
/// let pool = TokenizePool::global();
/// assert!(pool.threads() >= 1);
/// // Runs on a pool thread; the caller waits for the result.
/// let on_pool = pool.install(|| pool.on_pool_thread());
/// assert!(on_pool);
/// assert!(!pool.on_pool_thread());
/// ```
pub struct TokenizePool {
    pool: rayon::ThreadPool,
}

impl std::fmt::Debug for TokenizePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenizePool")
            .field("threads", &self.threads())
            .finish()
    }
}

impl TokenizePool {
    /// A pool of `threads` threads (at least 1), named `streampool-tok-N`.
    pub fn new(threads: usize) -> Result<Self> {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads.max(1))
            .thread_name(|i| format!("streampool-tok-{i}"))
            // A panic in a spawned job must not abort the process (rayon's default without
            // a handler); `spawn` catches them itself, this covers anything that slips by.
            .panic_handler(|_| tracing::error!("a tokenization job panicked"))
            .build()
            .map_err(|e| Error::Tokenizer(format!("starting the tokenization pool: {e}")))?;
        Ok(Self { pool })
    }

    /// The process's pool, started on first use with the process's
    /// [`Settings::tokenize_threads`](crate::settings::Settings::tokenize_threads)
    /// (`STREAMPOOL_TOKENIZE_THREADS`) threads or, unset, one per available core. If the
    /// threads cannot be started (a process at its thread limit) it falls back to a pool of
    /// one thread, and if even that fails, panics: nothing can tokenize then.
    pub fn global() -> &'static TokenizePool {
        static POOL: OnceLock<TokenizePool> = OnceLock::new();
        POOL.get_or_init(|| {
            let threads = crate::settings::settings()
                .tokenize_threads
                .filter(|&n| n > 0)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
            TokenizePool::new(threads)
                .or_else(|_| TokenizePool::new(1))
                .expect("cannot start even one tokenization thread")
        })
    }

    /// Threads in the pool.
    pub fn threads(&self) -> usize {
        self.pool.current_num_threads()
    }

    /// Whether the calling thread is one of this pool's.
    pub fn on_pool_thread(&self) -> bool {
        self.pool.current_thread_index().is_some()
    }

    /// Runs `op` on the pool and waits for its result; rayon parallel iterators inside `op`
    /// use this pool's threads. From one of this pool's own threads `op` runs inline. A
    /// panic in `op` is resumed on the caller.
    pub fn install<R: Send>(&self, op: impl FnOnce() -> R + Send) -> R {
        self.pool.install(op)
    }

    /// `f` over `items`, results in order; the first error in item order fails the whole
    /// call. On one of this pool's threads the items are spread over the pool (rayon hands
    /// them out as threads come free); on any other thread they run serially there. So the
    /// caller picks where the work runs by where it calls from: small work inline, large
    /// work handed to the pool with [`Self::spawn`] or [`Self::install`] first.
    ///
    /// ```
    /// use streampool_nn::TokenizePool;
    /// let pool = TokenizePool::new(2).unwrap();
    /// let square = |x: &i32| if *x < 0 { Err("negative") } else { Ok(x * x) };
    /// assert_eq!(pool.install(|| pool.map(&[1, 2, 3], square)), Ok(vec![1, 4, 9]));
    /// assert_eq!(pool.map(&[1, -2, -3], square), Err("negative"));
    /// ```
    pub fn map<T, R, E>(
        &self,
        items: &[T],
        f: impl Fn(&T) -> std::result::Result<R, E> + Sync + Send,
    ) -> std::result::Result<Vec<R>, E>
    where
        T: Sync,
        R: Send,
        E: Send,
    {
        if items.len() < 2 || !self.on_pool_thread() {
            return items.iter().map(f).collect();
        }
        let results: Vec<std::result::Result<R, E>> =
            self.install(|| items.par_iter().map(&f).collect());
        results.into_iter().collect()
    }

    /// Runs `job` on the pool without waiting (hand results back through a channel, e.g. a
    /// `tokio::sync::oneshot` that an async task awaits). A panic in `job` is caught and
    /// logged as an error; whatever `job` owned (such as the channel's sender) is dropped,
    /// so a waiting receiver sees a closed channel rather than hanging.
    ///
    /// ```
    /// use streampool_nn::{tiny_bert_dir, BertTokenizer, TokenizePool};
    /// let tok = BertTokenizer::from_file(tiny_bert_dir().join("tokenizer.json"), 128).unwrap();
    /// let (tx, rx) = std::sync::mpsc::channel();
    /// TokenizePool::global().spawn(move || {
    ///     let _ = tx.send(tok.encode_ids("handed to the pool"));
    /// });
    /// assert_eq!(rx.recv().unwrap().unwrap().len(), 6);
    /// ```
    pub fn spawn(&self, job: impl FnOnce() + Send + 'static) {
        self.pool.spawn(move || {
            if catch_unwind(AssertUnwindSafe(job)).is_err() {
                tracing::error!("a tokenization job panicked");
            }
        });
    }
}
