//! `streampool.SentenceEmbedder`: sentence-transformers' `encode` over
//! [`streampool_nn::SentenceEmbedder`].

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use numpy::{PyArray1, PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};
use streampool_core::{EmbedBatch, EmbedInput};
use streampool_nn::{ComputeDType, SentenceEmbedder};

use crate::{device, Error, Result};

/// How many batches are queued on the device ahead of the read-back: while the device runs
/// batch i, the caller tokenizes and queues batch i+1 and then reads batch i back. Two keep
/// the device busy and bound what one call holds (and how long a Ctrl-C waits).
const IN_FLIGHT: usize = 2;

/// A sentence-embedding model on one device (see the Python docstrings in
/// `python/streampool/__init__.pyi`). Immutable after loading, so one object serves any
/// number of Python threads at once.
#[pyclass(frozen, module = "streampool._streampool", name = "SentenceEmbedder")]
pub struct PyEmbedder {
    pub(crate) inner: Arc<SentenceEmbedder>,
    /// The inference core's batch adapter of `inner`: what the server and `BatchQueue` run.
    batch: EmbedBatch,
    pub(crate) device: String,
    dtype: ComputeDType,
    path: PathBuf,
}

/// Sentences from Python: one `str`, or any iterable of `str`. `true` when it was one string
/// (the result is then one vector).
fn sentences(obj: &Bound<'_, PyAny>) -> PyResult<(Vec<String>, bool)> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok((vec![s.to_cow()?.into_owned()], true));
    }
    let items = obj.try_iter().map_err(|_| {
        Error::Type(format!(
            "sentences must be a str or a sequence of str, not {}",
            type_name(obj)
        ))
    })?;
    let mut out = Vec::with_capacity(obj.len().unwrap_or(0));
    for (i, item) in items.enumerate() {
        let item = item?;
        let s = item.downcast::<PyString>().map_err(|_| {
            Error::Type(format!(
                "sentences[{i}] is a {}, not a str",
                type_name(&item)
            ))
        })?;
        out.push(s.to_cow()?.into_owned());
    }
    if out.is_empty() {
        return Err(Error::Value("sentences is empty: give at least one str".into()).into());
    }
    Ok((out, false))
}

pub(crate) fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

impl PyEmbedder {
    /// Embeds `texts` into `out` (`[texts.len(), dim]`, row-major), in batches of `batch`
    /// texts sorted by length (as sentence-transformers sorts, so a batch pads to similar
    /// lengths), each row written at its text's position. `interrupt` is asked between
    /// batches whether to stop (Ctrl-C).
    fn encode_into(
        &self,
        texts: &[&str],
        prompt: Option<&str>,
        batch: usize,
        normalize: bool,
        out: &mut [f32],
        interrupt: &dyn Fn() -> PyResult<()>,
    ) -> PyResult<()> {
        let dim = self.inner.dim();
        // Longest first: the first batch finds any out-of-memory at once, as in
        // sentence-transformers.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
        let normalize = normalize || self.inner.pooling().normalize;
        let mut pending = std::collections::VecDeque::with_capacity(IN_FLIGHT);
        let mut chunks = order.chunks(batch.max(1)).peekable();
        let several = order.len() > batch;
        while chunks.peek().is_some() || !pending.is_empty() {
            if pending.len() < IN_FLIGHT {
                if let Some(chunk) = chunks.next() {
                    let refs: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
                    let inputs: Vec<EmbedInput> = self
                        .batch
                        .tokenize(&refs, prompt)
                        .map_err(Error::from)?
                        .into_iter()
                        .map(|ids| EmbedInput { ids, normalize })
                        .collect();
                    let launched = self.batch.launch(inputs).map_err(Error::from)?;
                    pending.push_back((chunk, launched));
                    continue;
                }
            }
            let Some((chunk, launched)) = pending.pop_front() else {
                break;
            };
            let rows = launched.rows().map_err(Error::from)?;
            for (row, &i) in rows.into_iter().zip(chunk) {
                out[i * dim..(i + 1) * dim].copy_from_slice(&row.map_err(Error::from)?);
            }
            if several {
                interrupt()?;
            }
        }
        Ok(())
    }
}

#[pymethods]
impl PyEmbedder {
    #[new]
    #[pyo3(signature = (model_name_or_path, device = "cpu", dtype = None))]
    fn new(
        py: Python<'_>,
        model_name_or_path: PathBuf,
        device: &str,
        dtype: Option<&str>,
    ) -> PyResult<Self> {
        let path = model_name_or_path;
        if !path.is_dir() {
            return Err(Error::NotFound(format!(
                "{}: no such model folder (give a folder with config.json, tokenizer.json and \
                 model.safetensors; models are not downloaded)",
                path.display()
            ))
            .into());
        }
        let load = || -> Result<Self> {
            let dev = device::open(device)?;
            let dtype = device::dtype(dtype, &dev)?;
            let inner = Arc::new(SentenceEmbedder::load_with(&dev, &path, dtype)?);
            Ok(Self {
                batch: EmbedBatch::new(inner.clone()),
                inner,
                device: device::name(&dev),
                dtype,
                path: path.clone(),
            })
        };
        Ok(py.allow_threads(load)?)
    }

    #[pyo3(signature = (
        sentences,
        batch_size = 32,
        normalize_embeddings = false,
        convert_to_numpy = true,
        show_progress_bar = false,
        prompt_name = None,
        prompt = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn encode<'py>(
        &self,
        py: Python<'py>,
        sentences: &Bound<'py, PyAny>,
        batch_size: usize,
        normalize_embeddings: bool,
        convert_to_numpy: bool,
        show_progress_bar: bool,
        prompt_name: Option<&str>,
        prompt: Option<&str>,
    ) -> PyResult<Bound<'py, PyAny>> {
        // No progress bar is drawn; the flag is accepted so that code written for
        // sentence-transformers runs unchanged.
        let _ = show_progress_bar;
        if batch_size == 0 {
            return Err(Error::Value("batch_size must be at least 1".into()).into());
        }
        let (texts, single) = self::sentences(sentences)?;
        let prefix = self
            .inner
            .resolve_prompt(prompt_name, prompt)
            .map_err(Error::from)?
            .filter(|p| !p.is_empty())
            .map(str::to_owned);
        let dim = self.inner.dim();
        let n = texts.len();
        let array = PyArray2::<f32>::zeros(py, [n, dim], false);
        {
            // SAFETY: `array` was just created here, C-contiguous, and no other reference to it
            // exists until we return it, so this is the only view of its memory while the
            // GIL is released below.
            let out = unsafe { array.as_slice_mut() }.map_err(|e| Error::Value(e.to_string()))?;
            py.allow_threads(|| {
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                // Ctrl-C: the signal handler only sets a flag, which Python checks when it
                // holds the GIL; between batches we take it briefly to look (a no-op off the
                // main thread).
                let interrupt = || Python::with_gil(|py| py.check_signals());
                self.encode_into(
                    &refs,
                    prefix.as_deref(),
                    batch_size,
                    normalize_embeddings,
                    out,
                    &interrupt,
                )
            })?;
        }
        if single {
            return Ok(array.reshape([dim])?.into_any());
        }
        if convert_to_numpy {
            Ok(array.into_any())
        } else {
            // sentence-transformers gives a list of per-sentence tensors here; we give a list
            // of per-sentence float32 arrays (views of one array).
            let rows: Vec<Bound<'py, PyAny>> = (0..n)
                .map(|i| array.as_any().get_item(i))
                .collect::<PyResult<_>>()?;
            Ok(PyList::new(py, rows)?.into_any())
        }
    }

    /// The embedding width.
    fn get_sentence_embedding_dimension(&self) -> usize {
        self.inner.dim()
    }

    /// Most tokens per text (longer texts are truncated), special tokens included.
    #[getter]
    fn max_seq_length(&self) -> usize {
        self.inner.tokenizer().max_len()
    }

    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    /// The model's named prompts (`config_sentence_transformers.json`).
    #[getter]
    fn prompts(&self) -> std::collections::BTreeMap<String, String> {
        self.inner.prompts().clone()
    }

    fn __repr__(&self) -> String {
        format!(
            "SentenceEmbedder({:?}, device={:?}, dtype={:?}, dim={})",
            self.path.display().to_string(),
            self.device,
            self.dtype.name(),
            self.inner.dim()
        )
    }

    /// The Rust API's own answer for `texts` (`SentenceEmbedder::embed`, no sorting, no
    /// batching of ours): the reference the tests compare `encode` with.
    fn _embed_rust(&self, py: Python<'_>, texts: Vec<String>) -> PyResult<Vec<Vec<f32>>> {
        py.allow_threads(|| {
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            Ok(self.inner.embed(&refs).map_err(Error::from)?)
        })
    }

    /// Seconds per call of the Rust API (`SentenceEmbedder::embed(&[text])`), timed in Rust
    /// over `iters` calls: the baseline the benchmark sets the binding's per-call time against.
    fn _time_rust(&self, py: Python<'_>, text: String, iters: usize) -> PyResult<f64> {
        py.allow_threads(|| {
            let start = Instant::now();
            for _ in 0..iters.max(1) {
                std::hint::black_box(self.inner.embed(&[text.as_str()]).map_err(Error::from)?);
            }
            Ok(start.elapsed().as_secs_f64() / iters.max(1) as f64)
        })
    }
}

/// For the queue: a vector of floats as a NumPy array, moved in without copying.
pub(crate) fn to_numpy(py: Python<'_>, row: Vec<f32>) -> Bound<'_, PyArray1<f32>> {
    PyArray1::from_vec(py, row)
}
