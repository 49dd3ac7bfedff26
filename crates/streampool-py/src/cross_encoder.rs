//! `streampool.CrossEncoder`: a reranker or classifier scoring texts and text pairs, as
//! sentence-transformers' `CrossEncoder`. The native class computes logits through the
//! inference core's classifier adapter (the server's); the Python subclass in
//! `python/streampool/__init__.py` adds `predict`'s activation and `rank`.

use std::path::PathBuf;
use std::sync::Arc;

use numpy::{PyArray2, PyArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};
use streampool_core::ClassifyBatch;
use streampool_nn::{Classifier, ComputeDType};

use crate::embedder::type_name;
use crate::{device, Error, Result};

/// A sequence classifier on one device (see the Python docstrings in
/// `python/streampool/__init__.pyi`). Immutable after loading, so one object serves any
/// number of Python threads at once.
#[pyclass(
    frozen,
    subclass,
    module = "streampool._streampool",
    name = "CrossEncoder"
)]
pub struct PyCrossEncoder {
    batch: ClassifyBatch,
    device: String,
    dtype: ComputeDType,
    path: PathBuf,
}

/// One input from Python: a `str`, or a pair of `str` (a tuple or list of two).
fn item(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<(String, Option<String>)> {
    if let Ok(s) = obj.downcast::<PyString>() {
        return Ok((s.to_cow()?.into_owned(), None));
    }
    let wrong = || {
        Error::Type(format!(
            "sentences[{i}] must be a str or a pair of str, not {}",
            type_name(obj)
        ))
    };
    let parts: Vec<Bound<'_, PyAny>> = if let Ok(t) = obj.downcast::<PyTuple>() {
        t.iter().collect()
    } else if let Ok(l) = obj.downcast::<pyo3::types::PyList>() {
        l.iter().collect()
    } else {
        return Err(wrong().into());
    };
    match &parts[..] {
        [a, b] => {
            let a = a.downcast::<PyString>().map_err(|_| wrong())?;
            let b = b.downcast::<PyString>().map_err(|_| wrong())?;
            Ok((a.to_cow()?.into_owned(), Some(b.to_cow()?.into_owned())))
        }
        _ => Err(wrong().into()),
    }
}

#[pymethods]
impl PyCrossEncoder {
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
                 model.safetensors of a *ForSequenceClassification checkpoint; models are not \
                 downloaded)",
                path.display()
            ))
            .into());
        }
        let load = || -> Result<Self> {
            let dev = device::open(device)?;
            let dtype = device::dtype(dtype, &dev)?;
            let classifier = Arc::new(Classifier::load_with(&dev, &path, dtype)?);
            Ok(Self {
                batch: ClassifyBatch::new(classifier),
                device: device::name(&dev),
                dtype,
                path: path.clone(),
            })
        };
        Ok(py.allow_threads(load)?)
    }

    /// The logits `[len(sentences), num_labels]` of texts and `(text, text_pair)` pairs, in
    /// batches of `batch_size` (the GIL released throughout); each input truncated to the
    /// model's limit.
    #[pyo3(signature = (sentences, batch_size = 32))]
    fn _logits<'py>(
        &self,
        py: Python<'py>,
        sentences: &Bound<'py, PyAny>,
        batch_size: usize,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        if batch_size == 0 {
            return Err(Error::Value("batch_size must be at least 1".into()).into());
        }
        let items: Vec<(String, Option<String>)> = sentences
            .try_iter()
            .map_err(|_| Error::Type("sentences must be a sequence of str or pairs".into()))?
            .enumerate()
            .map(|(i, obj)| item(&obj?, i))
            .collect::<PyResult<_>>()?;
        let labels = self.batch.classifier().labels().len();
        let n = items.len();
        let array = PyArray2::<f32>::zeros(py, [n, labels], false);
        {
            // SAFETY: `array` was just created here, C-contiguous, and no other reference to it
            // exists until we return it, so this is the only view of its memory while the
            // GIL is released below.
            let out = unsafe { array.as_slice_mut() }.map_err(|e| Error::Value(e.to_string()))?;
            py.allow_threads(|| -> Result<()> {
                for (chunk, dst) in items
                    .chunks(batch_size)
                    .zip(out.chunks_mut(batch_size * labels))
                {
                    let refs: Vec<(&str, Option<&str>)> = chunk
                        .iter()
                        .map(|(a, b)| (a.as_str(), b.as_deref()))
                        .collect();
                    let inputs = self.batch.tokenize(&refs)?;
                    for (row, d) in self
                        .batch
                        .run(inputs)?
                        .into_iter()
                        .zip(dst.chunks_mut(labels))
                    {
                        d.copy_from_slice(&row?);
                    }
                }
                Ok(())
            })?;
        }
        Ok(array)
    }

    /// The number of labels (1 for a reranker).
    #[getter]
    fn num_labels(&self) -> usize {
        self.batch.classifier().labels().len()
    }

    /// The label names, by class index.
    #[getter]
    fn labels(&self) -> Vec<String> {
        self.batch.classifier().labels().to_vec()
    }

    /// The longest input in tokens (special tokens included); longer inputs are truncated.
    #[getter]
    fn max_length(&self) -> usize {
        self.batch.classifier().tokenizer().max_len()
    }

    /// The device, as `"cpu"` or `"cuda:0"`.
    #[getter]
    fn device(&self) -> &str {
        &self.device
    }

    /// The compute dtype, as `"f32"`, `"f16"`, ...
    #[getter]
    fn dtype(&self) -> String {
        self.dtype.to_string()
    }

    fn __repr__(&self) -> String {
        format!(
            "CrossEncoder({:?}, device={:?}, dtype={:?}, num_labels={})",
            self.path.display().to_string(),
            self.device,
            self.dtype.to_string(),
            self.num_labels()
        )
    }
}
