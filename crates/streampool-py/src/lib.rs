//! Python bindings: `streampool.SentenceEmbedder` (sentence-transformers' `encode`),
//! `streampool.CrossEncoder` (its `CrossEncoder`: `predict` and `rank`) and
//! `streampool.BatchQueue` (dynamic batching for many Python threads or asyncio tasks).
//!
//! Built with maturin into the `streampool` Python package (`python/streampool`); this crate
//! is its native module `streampool._streampool`. Every call releases the GIL for all of its
//! Rust work (tokenizing, the forward, the read-back), so Python threads run on the device's
//! streams in parallel: each OS thread has its own current stream, as in the Rust API.
//!
//! | Python | Rust |
//! |---|---|
//! | `SentenceEmbedder(path, device, dtype)` | [`streampool_nn::SentenceEmbedder::load_with`] |
//! | `SentenceEmbedder.encode(sentences)` | the inference core's [`streampool_core::EmbedBatch`] (the server's adapter): `tokenize` + `launch` per batch, rows written into the NumPy array |
//! | `CrossEncoder(path, device, dtype)`, `.predict(pairs)`, `.rank(query, docs)` | [`streampool_nn::Classifier::load_with`]; the core's [`streampool_core::ClassifyBatch`] per batch |
//! | `BatchQueue(model, ...)` | the core's [`streampool_core::EmbedderEndpoint`] (one replica, its batch queue) |
//! | `BatchQueue.encode(text)` / `submit(text, callback)` | `EmbedderEndpoint::submit` + [`streampool_core::wait_row`] / a completion thread |
//!
//! Errors arrive as Python exceptions (see [`Error`]): `ValueError` for bad input or model
//! files, `TypeError` for a non-string sentence, `FileNotFoundError` for a missing folder,
//! `MemoryError` for device memory exhaustion, `RuntimeError` for the rest.

mod cross_encoder;
mod device;
mod embedder;
mod error;
mod queue;

pub use error::{Error, Result};

use pyo3::prelude::*;

/// Whether this build has the CUDA backend (`device="cuda"`).
#[pyfunction]
fn cuda_available() -> bool {
    cfg!(feature = "cuda")
}

/// The native module `streampool._streampool`; the `streampool` package re-exports it.
#[pymodule]
fn _streampool(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<embedder::PyEmbedder>()?;
    m.add_class::<queue::PyBatchQueue>()?;
    m.add_class::<cross_encoder::PyCrossEncoder>()?;
    m.add_function(wrap_pyfunction!(cuda_available, m)?)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
