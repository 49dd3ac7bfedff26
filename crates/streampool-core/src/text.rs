//! Text to token ids for the served text models, at a cost bounded by each request's size
//! and deadline.
//!
//! - **What is read.** Each input is read only as far as the model's token limit needs
//!   ([`InputLimit`]: a prefix at a time, at most `max_input_bytes`), in one pass whether it
//!   is truncated or refused; a prompt and a reranker's query are read once per request and
//!   joined with each text's tokens, never re-tokenized per input.
//! - **Where.** Requests of more than a kilobyte of text tokenize on the process's
//!   tokenization pool, never on a front end's async workers; smaller ones inline (a few
//!   microseconds, less than the hand-off).
//! - **Until when.** Between inputs the pool job checks the request's deadline (its timeout
//!   counts from arrival) and whether anyone still waits for it: a request whose client went
//!   away (the connection's future dropped, and with it the receiver) or whose deadline
//!   passed stops at the next input and frees what it held. The handler's wait is bounded by
//!   the deadline too, so it answers 504 on time however long an input takes.

use std::time::Instant;

use streampool_batch::BatchConfig;
use streampool_nn::{BertTokenizer, InputLimit, TokenizePool};

use crate::{Error, ModelConfig, Result};

/// Requests with fewer bytes of text than this tokenize inline: about 5 ns per byte of ASCII
/// on the fast path, 250 ns per byte through `tokenizers`, so a kilobyte costs less than the
/// hand-off to the pool.
pub(crate) const INLINE_TOKENIZE_BYTES: usize = 1 << 10;

/// Bucket lengths for token sequences: short inputs are not batched with (and padded to)
/// long ones.
const BUCKETS: [usize; 6] = [16, 32, 64, 128, 256, 512];

/// The length limit of a text model's endpoint (embedder or classifier) and the tokenizer
/// that applies it: the model's own, so its fast path and its results are those of the model
/// in process.
pub(crate) struct TextLimits {
    pub(crate) tokenizer: BertTokenizer,
    pub(crate) max_seq_len: usize,
    pub(crate) truncate: bool,
    max_bytes: usize,
}

impl TextLimits {
    /// Limits for a model whose tokenizer is `tokenizer` under `config`: its `max_seq_len`
    /// (never above the model's own), its `truncate` default and its `max_input_bytes`
    /// (derived from the token limit when unset).
    pub(crate) fn new(tokenizer: &BertTokenizer, config: &ModelConfig) -> Self {
        let model_max = tokenizer.max_len();
        let max_seq_len = config.max_seq_len.unwrap_or(model_max).min(model_max);
        let max_bytes = config
            .max_input_bytes
            .unwrap_or(InputLimit::new(max_seq_len, false).max_bytes);
        Self {
            tokenizer: tokenizer.clone(),
            max_seq_len,
            truncate: config.truncate,
            max_bytes,
        }
    }

    /// The limit one input is read under, truncating or not.
    pub(crate) fn limit(&self, truncate: bool) -> InputLimit {
        InputLimit {
            max_tokens: self.max_seq_len,
            truncate,
            max_bytes: self.max_bytes,
        }
    }

    /// `config`'s batch settings with length buckets up to `max_seq_len`.
    pub(crate) fn batch_config(&self, config: &ModelConfig) -> BatchConfig {
        let mut buckets: Vec<usize> = BUCKETS
            .into_iter()
            .filter(|&b| b < self.max_seq_len)
            .collect();
        buckets.push(self.max_seq_len);
        BatchConfig {
            buckets,
            ..config.batch.clone()
        }
    }

    /// The refusal of an input of `n` tokens when not truncating (the tokenizer's own
    /// refusal, so token ids and texts are refused in the same words).
    pub(crate) fn too_long(&self, n: usize) -> Error {
        crate::error::refusal(streampool_nn::Error::InputTooLong {
            tokens: streampool_nn::TokenCount::Exactly(n),
            max: self.max_seq_len,
        })
    }
}

/// Runs `f` over `items` in order, the first error (in item order) failing the whole, within
/// `deadline` (see the module docs): inline when `bytes` is small, else on the tokenization
/// pool, spread over its threads, stopping early when the deadline passes or the caller is
/// gone.
pub(crate) async fn tokenize<T, R>(
    items: Vec<T>,
    bytes: usize,
    deadline: Instant,
    f: impl Fn(&T) -> Result<R> + Send + Sync + 'static,
) -> Result<Vec<R>>
where
    T: Send + Sync + 'static,
    R: Send + 'static,
{
    if bytes <= INLINE_TOKENIZE_BYTES {
        return items.iter().map(f).collect();
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let pool = TokenizePool::global();
    pool.spawn(move || {
        let result = pool.map(&items, |item| {
            // A closed channel: the handler was dropped (its client went away) or gave up at
            // the deadline.
            if tx.is_closed() {
                return Err(Error::Cancelled);
            }
            if Instant::now() >= deadline {
                return Err(late());
            }
            f(item)
        });
        drop(items);
        // The receiver is gone only if the request was dropped: nothing to answer.
        let _ = tx.send(result);
    });
    match tokio::time::timeout_at(tokio::time::Instant::from_std(deadline), rx).await {
        Ok(answer) => answer.map_err(|_| Error::Model("the tokenization task failed".into()))?,
        // Returning drops the receiver, which tells the job to stop at its next input.
        Err(_) => Err(late()),
    }
}

fn late() -> Error {
    Error::DeadlineExceeded("the request's deadline passed while tokenizing".into())
}

/// [`tokenize`] for a caller on its own thread (no deadline, nobody to go away): inline when
/// `bytes` is small, else spread over the tokenization pool while the caller waits.
pub(crate) fn tokenize_blocking<T, R>(
    items: &[T],
    bytes: usize,
    f: impl Fn(&T) -> Result<R> + Send + Sync,
) -> Result<Vec<R>>
where
    T: Sync,
    R: Send,
{
    if bytes <= INLINE_TOKENIZE_BYTES {
        return items.iter().map(f).collect();
    }
    let pool = TokenizePool::global();
    pool.install(|| pool.map(items, f))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    /// 400 inputs of 5 ms each (2 s on one thread), counting those that ran.
    fn slow_job(ran: &Arc<AtomicUsize>) -> impl Fn(&u32) -> Result<()> + Send + Sync + 'static {
        let ran = ran.clone();
        move |_| {
            std::thread::sleep(Duration::from_millis(5));
            ran.fetch_add(1, Ordering::Relaxed);
            Ok(())
        }
    }

    /// Waits until no input has started for a while, then returns how many ran.
    async fn settled(ran: &AtomicUsize) -> usize {
        // An input in flight when the job was told to stop finishes within 5 ms.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let n = ran.load(Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            ran.load(Ordering::Relaxed),
            n,
            "an input started after the stop"
        );
        n
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_dropped_request_stops_at_the_next_input() {
        let ran = Arc::new(AtomicUsize::new(0));
        let far = Instant::now() + Duration::from_secs(60);
        let work = tokenize((0..400).collect(), usize::MAX, far, slow_job(&ran));
        // Dropped after 50 ms, as a handler's future is when its client goes away.
        assert!(tokio::time::timeout(Duration::from_millis(50), work)
            .await
            .is_err());
        assert!(settled(&ran).await < 400);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_deadline_answers_on_time_and_stops_the_work() {
        let ran = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let deadline = start + Duration::from_millis(50);
        let got = tokenize((0..400).collect(), usize::MAX, deadline, slow_job(&ran)).await;
        assert!(matches!(got, Err(Error::DeadlineExceeded(_))), "{got:?}");
        // On time: the wait is bounded by the deadline, not by the work (2 s).
        assert!(start.elapsed() < Duration::from_secs(1));
        assert!(settled(&ran).await < 400);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_requests_run_inline_and_in_order() {
        let far = Instant::now() + Duration::from_secs(60);
        let got = tokenize(vec![3, 1, 2], 3, far, |x: &u32| Ok(x * 10)).await;
        assert_eq!(got.unwrap(), [30, 10, 20]);
        let got = tokenize((0..100).collect(), usize::MAX, far, |x: &u32| {
            if *x >= 40 {
                Err(Error::InvalidInput(format!("input {x}")))
            } else {
                Ok(*x)
            }
        })
        .await;
        // The first refusal in input order, whatever order the pool ran them in.
        assert!(matches!(got, Err(Error::InvalidInput(m)) if m == "input 40"));
    }
}
