//! `streampool.BatchQueue`: many callers' single texts batched into one forward
//! ([`streampool_batch::BatchQueue`]), blocking (`encode`) or with a completion callback
//! (`submit`, which the Python package turns into `await queue.encode_async(text)`).
//!
//! Callbacks run on one completion thread per queue. A request's [`Handle`] is a future; the
//! completion thread polls it with a waker that, when the batch worker answers, sends the
//! request back to the completion thread, which then takes the GIL and calls the callback.
//! So a worker never waits for the GIL, and no thread polls or sleeps.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use crossbeam_channel::{unbounded, Receiver, Sender};
use pyo3::prelude::*;
use pyo3::types::PyString;
use streampool_batch::{BatchConfig, Handle};
use streampool_core::{EmbedderEndpoint, ModelConfig, RowOutput};

use crate::embedder::{to_numpy, PyEmbedder};
use crate::{Error, Result};

/// A request waiting for its answer on the completion thread.
struct Waiter {
    /// Taken when the answer is delivered. Only the completion thread locks it (the waker
    /// merely sends the `Arc`), so the lock is never contended; it is held while polling,
    /// which does not block.
    handle: Mutex<Option<Handle<RowOutput>>>,
    callback: Py<PyAny>,
    completions: Sender<Arc<Waiter>>,
}

impl Wake for Waiter {
    fn wake(self: Arc<Self>) {
        let tx = self.completions.clone();
        // The receiver lives as long as any sender (the completion thread exits only once
        // every sender, including this one, is gone), so the send cannot fail.
        let _ = tx.send(self);
    }
}

/// The completion thread: polls each request it is sent; delivers the answered ones.
fn complete(rx: Receiver<Arc<Waiter>>) {
    for waiter in rx {
        let answer = {
            // See `Waiter::handle`: only this thread locks it.
            let mut slot = waiter.handle.lock().unwrap_or_else(PoisonError::into_inner);
            let Some(handle) = slot.as_mut() else {
                continue;
            };
            let waker = Waker::from(waiter.clone());
            match Pin::new(handle).poll(&mut Context::from_waker(&waker)) {
                Poll::Pending => continue,
                Poll::Ready(answer) => {
                    *slot = None;
                    answer
                }
            }
        };
        let result = answer
            .map_err(streampool_core::Error::from_batch)
            .and_then(|row| row)
            .map_err(Error::from);
        Python::with_gil(|py| {
            let (value, error) = match result {
                Ok(row) => (to_numpy(py, row).into_any().unbind(), py.None()),
                Err(e) => (py.None(), PyErr::from(e).into_value(py).into_any()),
            };
            if let Err(e) = waiter.callback.call1(py, (value, error)) {
                e.write_unraisable(py, Some(waiter.callback.bind(py)));
            }
        });
    }
}

/// A batch queue over one `SentenceEmbedder` (see the Python docstrings in
/// `python/streampool/__init__.pyi`).
#[pyclass(
    frozen,
    subclass,
    module = "streampool._streampool",
    name = "BatchQueue"
)]
pub struct PyBatchQueue {
    /// The inference core's embedder: one replica, this queue's settings; the server's
    /// endpoint and batch adapter, so a text gets the same embedding through either.
    endpoint: Arc<EmbedderEndpoint>,
    /// The model's default prompt, prepended to every text.
    prompt: Option<String>,
    /// Every embedding has unit length (asked, or the model's own pooling normalizes).
    normalize: bool,
    completions: Sender<Arc<Waiter>>,
}

impl PyBatchQueue {
    /// Tokenizes `text` (with the model's default prompt; truncated to the model's limit,
    /// as sentence-transformers does) and queues it.
    fn queue(&self, text: &str) -> Result<Handle<RowOutput>> {
        let ids = self
            .endpoint
            .tokenize_texts_blocking(&[text], self.prompt.as_deref(), true)?;
        let mut handles = self.endpoint.submit(ids, self.normalize, None)?;
        // One input, one handle.
        handles
            .pop()
            .ok_or_else(|| Error::Value("the queue answered no handle".into()))
    }
}

fn text_arg(text: &Bound<'_, PyAny>) -> PyResult<String> {
    let s = text.downcast::<PyString>().map_err(|_| {
        Error::Type(format!(
            "text must be a str, not {}",
            text.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    Ok(s.to_cow()?.into_owned())
}

#[pymethods]
impl PyBatchQueue {
    #[new]
    #[pyo3(signature = (
        model,
        max_batch_tokens = 16_384,
        max_batch_size = 32,
        workers = 2,
        max_queue = 1024,
        max_wait_ms = 0.0,
        normalize_embeddings = false,
        priority = "normal",
        weight = 1,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        model: &Bound<'_, PyEmbedder>,
        max_batch_tokens: usize,
        max_batch_size: usize,
        workers: usize,
        max_queue: usize,
        max_wait_ms: f64,
        normalize_embeddings: bool,
        priority: &str,
        weight: u32,
    ) -> PyResult<Self> {
        let priority = priority
            .parse::<streampool_core::Priority>()
            .map_err(Error::Value)?;
        if !(max_wait_ms.is_finite() && max_wait_ms >= 0.0) {
            return Err(Error::Value(format!(
                "max_wait_ms must be a finite number >= 0, not {max_wait_ms}"
            ))
            .into());
        }
        let embedder = model.get().inner.clone();
        let config = ModelConfig {
            truncate: true,
            batch: BatchConfig {
                max_batch_size,
                max_batch_tokens,
                max_queue,
                max_wait: Duration::from_secs_f64(max_wait_ms / 1000.0),
                workers,
                priority,
                weight,
                ..BatchConfig::default()
            },
            ..ModelConfig::default()
        };
        let prompt = embedder
            .default_prompt()
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        let normalize = normalize_embeddings || embedder.pooling().normalize;
        let label = model.get().device.clone();
        let endpoint = py.allow_threads(|| {
            EmbedderEndpoint::new(vec![(label, embedder)], &config).map_err(Error::from)
        })?;
        let (tx, rx) = unbounded();
        std::thread::Builder::new()
            .name("streampool-py-completions".into())
            .spawn(move || complete(rx))
            .map_err(|e| Error::Value(format!("could not start the completion thread: {e}")))?;
        Ok(Self {
            endpoint: Arc::new(endpoint),
            prompt,
            normalize,
            completions: tx,
        })
    }

    /// Blocks (without the GIL) until `text`'s batch has run; its embedding `[dim]`.
    fn encode<'py>(
        &self,
        py: Python<'py>,
        text: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let text = text_arg(text)?;
        let row = py.allow_threads(|| -> Result<Vec<f32>> {
            Ok(streampool_core::wait_row(self.queue(&text)?, 0)?)
        })?;
        Ok(to_numpy(py, row).into_any())
    }

    /// Queues `text` and returns at once; `callback(embedding, None)` or
    /// `callback(None, exception)` is called later from the queue's completion thread.
    fn submit(&self, py: Python<'_>, text: &Bound<'_, PyAny>, callback: Py<PyAny>) -> PyResult<()> {
        let text = text_arg(text)?;
        let handle = py.allow_threads(|| self.queue(&text))?;
        let waiter = Arc::new(Waiter {
            handle: Mutex::new(Some(handle)),
            callback,
            completions: self.completions.clone(),
        });
        // The completion thread polls it first; see the module docs.
        let _ = self.completions.send(waiter);
        Ok(())
    }

    /// Requests waiting in the queue.
    #[getter]
    fn queue_len(&self) -> usize {
        self.endpoint.replicas().queue_len()
    }

    /// Stops accepting requests and answers the waiting ones once they have run.
    fn shutdown(&self, py: Python<'_>) {
        py.allow_threads(|| self.endpoint.shutdown());
    }

    fn __repr__(&self) -> String {
        let c = self.endpoint.batch_config();
        format!(
            "BatchQueue(max_batch_tokens={}, max_batch_size={}, workers={}, max_queue={}, \
             priority='{}', weight={})",
            c.max_batch_tokens,
            c.max_batch_size,
            c.workers,
            c.max_queue,
            c.priority.as_str(),
            c.weight
        )
    }
}
