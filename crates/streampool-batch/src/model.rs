//! What a batch queue needs from a model.

use std::any::Any;

use streampool::Device;

use crate::ModelError;

/// Facts about one batch, handed to [`BatchModel::forward_batch`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BatchContext {
    /// The length every input of this batch must be padded to: the bucket all of them fell
    /// into (see [`BatchConfig::buckets`](crate::BatchConfig::buckets)). `None` when no
    /// buckets are configured.
    pub padded_len: Option<usize>,
    /// Which worker runs the batch (`0..workers`).
    pub worker: usize,
}

impl BatchContext {
    /// A context as a queue passes it, for calling a model's batch methods directly (tests,
    /// benchmarks).
    ///
    /// ```
    /// use streampool_batch::BatchContext;
    /// let ctx = BatchContext::new(Some(32), 0);
    /// assert_eq!((ctx.padded_len, ctx.worker), (Some(32), 0));
    /// ```
    pub fn new(padded_len: Option<usize>, worker: usize) -> Self {
        Self { padded_len, worker }
    }
}

/// A model the queue can batch: it maps a batch of inputs to one output per input, in order.
///
/// **Who pads:** the queue groups requests by bucket and tells the model the bucket length
/// in [`BatchContext::padded_len`]; the model pads each input to that length and masks the
/// padding (for a BERT-style encoder: pad token ids, attention mask 0 on padded positions),
/// because only the model knows its padding value and how masking works in it. The queue
/// never touches the inputs.
///
/// `forward_batch` runs on a worker thread whose current stream (for
/// [`BatchModel::device`]) is the worker's own, so tensor ops inside it queue on that
/// stream. It may return an error or even panic: every request of that batch is then
/// answered with [`BatchError::Model`](crate::BatchError::Model) and the worker goes on.
///
/// ```
/// use streampool_batch::{BatchContext, BatchModel, ModelError};
/// struct Doubler;
/// impl BatchModel for Doubler {
///     type Input = f32;
///     type Output = f32;
///     fn forward_batch(&self, xs: Vec<f32>, _: &BatchContext) -> Result<Vec<f32>, ModelError> {
///         Ok(xs.into_iter().map(|x| 2.0 * x).collect())
///     }
/// }
/// ```
pub trait BatchModel: Send + Sync + 'static {
    /// One request's input.
    type Input: Send + 'static;
    /// One request's output.
    type Output: Send + 'static;

    /// Runs one batch. Must return exactly one output per input, in input order; a different
    /// count is answered to every caller of the batch as a model error.
    fn forward_batch(
        &self,
        inputs: Vec<Self::Input>,
        ctx: &BatchContext,
    ) -> Result<Vec<Self::Output>, ModelError>;

    /// Checks one input before it is queued, so a malformed input is refused to its own
    /// caller ([`BatchError::InvalidInput`](crate::BatchError::InvalidInput)) instead of
    /// failing a whole batch of other callers' requests. Default: accept everything.
    fn check_input(&self, _input: &Self::Input) -> Result<(), ModelError> {
        Ok(())
    }

    /// The length of `input` along its variable axis (e.g. tokens), used to pick its bucket
    /// when [`BatchConfig::buckets`](crate::BatchConfig::buckets) is set. Default: 0.
    fn input_len(&self, _input: &Self::Input) -> usize {
        0
    }

    /// How much work `input` is, in the unit a [`Replicas`](crate::Replicas) router balances:
    /// the router sends each request to the replica with the least outstanding cost (accepted
    /// and not yet answered). Default: 1 (one row). An embedder returns its token count, so
    /// a replica holding a few long inputs counts as busier than one holding many short ones.
    fn cost(&self, _input: &Self::Input) -> u64 {
        1
    }

    /// Whether the model runs a batch of mixed lengths unpadded (packed: every input's tokens
    /// back to back), so a batch costs the sum of its inputs' [`BatchModel::input_len`]
    /// against [`BatchConfig::max_batch_tokens`](crate::BatchConfig::max_batch_tokens)
    /// rather than rows x the longest. Default: `false` (padded to the longest). A
    /// [`SentenceEmbedder`](https://docs.rs/streampool-nn) in f16/bf16 packs.
    fn packs(&self) -> bool {
        false
    }

    /// The device the model runs on. When `Some`, each worker takes its own stream of that
    /// device's pool and makes it current for the worker's life. Default: `None` (a host-only
    /// model; workers then use no stream of their own).
    fn device(&self) -> Option<Device> {
        None
    }

    /// Whether the model has a host-side preparation step ([`BatchModel::prepare_batch`])
    /// worth overlapping with the device. When `true`, each worker of a
    /// [`BatchQueue`](crate::BatchQueue) is a two-stage pipeline: a preparing thread forms
    /// batch N+1 and runs `prepare_batch` on it while the worker's running thread runs batch
    /// N through [`BatchModel::forward_prepared`]. Default: `false` (one thread per worker
    /// calls [`BatchModel::forward_batch`], as a model without the step always did).
    fn prepares(&self) -> bool {
        false
    }

    /// Host work on a batch before it runs (e.g. tokenizing texts), on the worker's
    /// preparing thread, which has the worker's stream current as well. Only called when
    /// [`BatchModel::prepares`] is `true`; an error (or panic) answers every request of the
    /// batch with [`BatchError::Model`](crate::BatchError::Model). The default wraps the
    /// inputs unchanged, which the default [`BatchModel::forward_prepared`] unwraps: a model
    /// that overrides one overrides both.
    fn prepare_batch(
        &self,
        inputs: Vec<Self::Input>,
        _ctx: &BatchContext,
    ) -> Result<Prepared, ModelError> {
        Ok(Prepared::new(inputs))
    }

    /// Runs a batch made by [`BatchModel::prepare_batch`] on the worker's running thread; the
    /// same contract as [`BatchModel::forward_batch`] (one output per input, in order). The
    /// default passes the inputs wrapped by the default `prepare_batch` to `forward_batch`.
    fn forward_prepared(
        &self,
        prepared: Prepared,
        ctx: &BatchContext,
    ) -> Result<Vec<Self::Output>, ModelError> {
        let inputs = prepared.downcast::<Vec<Self::Input>>()?;
        self.forward_batch(inputs, ctx)
    }
}

/// A batch after [`BatchModel::prepare_batch`]: whatever the model made of its inputs on the
/// host (token ids, a padded matrix, ...), handed to [`BatchModel::forward_prepared`].
/// Type-erased so that a model without a preparation step names no extra type.
///
/// ```
/// use streampool_batch::Prepared;
/// let p = Prepared::new(vec![1u32, 2]);
/// assert_eq!(p.downcast::<Vec<u32>>().unwrap(), vec![1, 2]);
/// assert!(Prepared::new(1u8).downcast::<String>().is_err());
/// ```
pub struct Prepared(Box<dyn Any + Send>);

impl Prepared {
    /// Wraps a prepared batch.
    pub fn new<T: Send + 'static>(batch: T) -> Self {
        Self(Box::new(batch))
    }

    /// The prepared batch, if it is a `T`; an error naming `T` otherwise (a model whose
    /// `prepare_batch` and `forward_prepared` disagree on the type).
    pub fn downcast<T: 'static>(self) -> Result<T, ModelError> {
        self.0.downcast::<T>().map(|b| *b).map_err(|_| {
            format!(
                "prepared batch is not a {}: prepare_batch and forward_prepared disagree",
                std::any::type_name::<T>()
            )
            .into()
        })
    }
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Prepared(..)")
    }
}

/// A shared model is a model: lets callers keep an `Arc` to the model a queue runs.
impl<M: BatchModel> BatchModel for std::sync::Arc<M> {
    type Input = M::Input;
    type Output = M::Output;

    fn forward_batch(
        &self,
        inputs: Vec<Self::Input>,
        ctx: &BatchContext,
    ) -> Result<Vec<Self::Output>, ModelError> {
        (**self).forward_batch(inputs, ctx)
    }

    fn check_input(&self, input: &Self::Input) -> Result<(), ModelError> {
        (**self).check_input(input)
    }

    fn input_len(&self, input: &Self::Input) -> usize {
        (**self).input_len(input)
    }

    fn cost(&self, input: &Self::Input) -> u64 {
        (**self).cost(input)
    }

    fn packs(&self) -> bool {
        (**self).packs()
    }

    fn device(&self) -> Option<Device> {
        (**self).device()
    }

    fn prepares(&self) -> bool {
        (**self).prepares()
    }

    fn prepare_batch(
        &self,
        inputs: Vec<Self::Input>,
        ctx: &BatchContext,
    ) -> Result<Prepared, ModelError> {
        (**self).prepare_batch(inputs, ctx)
    }

    fn forward_prepared(
        &self,
        prepared: Prepared,
        ctx: &BatchContext,
    ) -> Result<Vec<Self::Output>, ModelError> {
        (**self).forward_prepared(prepared, ctx)
    }
}
