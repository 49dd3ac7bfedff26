//! Weights: memory-mapped safetensors files, read into host `f32` arrays.

use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::Mmap;
use safetensors::tensor::{Dtype, Metadata};
use safetensors::SafeTensors;
use streampool::phases::timed;
use streampool::{Device, Tensor};

use crate::{Error, Result};

/// A host array of `f32` with a shape: what layers are built from. Loaders read it from a
/// file, tests make it by hand.
///
/// ```
/// use streampool_nn::HostTensor;
/// let t = HostTensor::new(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
/// assert_eq!(t.transposed().unwrap().data(), &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
/// assert!(HostTensor::new(vec![1.0; 5], &[2, 3]).is_err());
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct HostTensor {
    data: Vec<f32>,
    shape: Vec<usize>,
}

impl HostTensor {
    /// `data` (row-major) with `shape`; errors if the element count does not fit.
    pub fn new(data: Vec<f32>, shape: &[usize]) -> Result<Self> {
        if shape.iter().product::<usize>() != data.len() {
            return Err(Error::Input(format!(
                "{} values do not fill shape {shape:?}",
                data.len()
            )));
        }
        Ok(Self {
            data,
            shape: shape.to_vec(),
        })
    }

    /// The values, row-major.
    pub fn data(&self) -> &[f32] {
        &self.data
    }

    /// The shape.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// The transpose of a matrix (`[r, c]` to `[c, r]`). Timed as start-up phase
    /// `weights transposed` (see `streampool::phases`).
    pub fn transposed(&self) -> Result<HostTensor> {
        timed("weights transposed", || self.transpose())
    }

    fn transpose(&self) -> Result<HostTensor> {
        let [r, c] = self.shape[..] else {
            return Err(Error::Input(format!(
                "transpose needs a matrix, got shape {:?}",
                self.shape
            )));
        };
        let mut out = vec![0.0; r * c];
        for i in 0..r {
            for j in 0..c {
                out[j * r + i] = self.data[i * c + j];
            }
        }
        HostTensor::new(out, &[c, r])
    }

    /// Copies the values to `device` (start-up phase `weights uploaded`).
    pub fn to_device(&self, device: &Device) -> Result<Tensor> {
        timed("weights uploaded", || {
            Ok(Tensor::from_slice(&self.data, &self.shape, device)?)
        })
    }

    pub(crate) fn expect_shape(&self, what: &str, shape: &[usize]) -> Result<()> {
        if self.shape != shape {
            return Err(Error::Input(format!(
                "{what}: shape {:?}, expected {shape:?}",
                self.shape
            )));
        }
        Ok(())
    }
}

/// A safetensors file, memory-mapped; the header is parsed and validated once at open.
pub struct WeightFile {
    path: PathBuf,
    mmap: Mmap,
    header_len: usize,
    metadata: Metadata,
}

/// Bytes before the JSON header of a safetensors file (its little-endian `u64` length).
const HEADER_PREFIX: usize = 8;

impl WeightFile {
    /// Maps `path` and validates its header (a truncated or corrupt file is an error here).
    /// Opening and [`WeightFile::get`] are timed as start-up phase `weights read`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        timed("weights read", || Self::map(path.as_ref()))
    }

    fn map(path: &Path) -> Result<Self> {
        let path = path.to_path_buf();
        let file = File::open(&path).map_err(|e| Error::io(&path, e))?;
        // SAFETY: the map is read-only and private to this process; a concurrent truncation of
        // the file by another process could fault, which is the accepted contract of memory
        // mapped model files (as in safetensors' own examples). We copy out of it at load time.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| Error::io(&path, e))?;
        let (header_len, metadata) =
            SafeTensors::read_metadata(&mmap).map_err(|source| Error::SafeTensors {
                path: path.clone(),
                source,
            })?;
        Ok(Self {
            path,
            mmap,
            header_len,
            metadata,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file holds a tensor called `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.metadata.info(name).is_some()
    }

    /// The names of all tensors, in file order.
    pub fn names(&self) -> Vec<String> {
        self.metadata.offset_keys()
    }

    /// Reads tensor `name`, which must have shape `expected`, as `f32` (F16 and BF16 are
    /// upcast; integer tensors are an error).
    pub fn get(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        timed("weights read", || self.read(name, expected))
    }

    fn read(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| Error::MissingTensor {
                path: self.path.clone(),
                name: name.to_string(),
            })?;
        if info.shape != expected {
            return Err(Error::TensorShape {
                path: self.path.clone(),
                name: name.to_string(),
                expected: expected.to_vec(),
                got: info.shape.clone(),
            });
        }
        let (start, end) = info.data_offsets;
        let base = HEADER_PREFIX + self.header_len;
        // `read_metadata` checked that the offsets are contiguous and end at the file's end.
        let bytes = &self.mmap[base + start..base + end];
        let data: Vec<f32> = match info.dtype {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(Error::TensorDType {
                    path: self.path.clone(),
                    name: name.to_string(),
                    dtype: other.to_string(),
                })
            }
        };
        HostTensor::new(data, expected).map_err(|_| Error::TensorShape {
            path: self.path.clone(),
            name: name.to_string(),
            expected: expected.to_vec(),
            got: vec![bytes.len()],
        })
    }
}
