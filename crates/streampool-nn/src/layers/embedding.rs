//! Embedding tables.

use streampool::{Device, Tensor};

use crate::weights::{HostTensor, WeightFile};
use crate::{ComputeDType, Error, Result};

/// A `[rows, dim]` lookup table.
///
/// ```
/// use streampool::Device;
/// use streampool_nn::{Embedding, HostTensor};
/// let table = HostTensor::new(vec![0.0, 0.0, 1.0, 2.0, 3.0, 4.0], &[3, 2]).unwrap();
/// let emb = Embedding::new(&table, &Device::cpu()).unwrap();
/// let y = emb.forward(&[2, 1], &[2]).unwrap();
/// assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 4.0, 1.0, 2.0]);
/// assert!(emb.forward(&[3], &[1]).is_err()); // out of range
/// ```
#[derive(Debug, Clone)]
pub struct Embedding {
    table: Tensor,
}

impl Embedding {
    /// Uploads a `[rows, dim]` table.
    pub fn new(table: &HostTensor, device: &Device) -> Result<Self> {
        if table.shape().len() != 2 {
            return Err(Error::Input(format!(
                "embedding table must be [rows, dim], got {:?}",
                table.shape()
            )));
        }
        Ok(Self {
            table: table.to_device(device)?,
        })
    }

    /// Reads `{name}` (`[rows, dim]`) from `file`.
    pub fn load(
        file: &WeightFile,
        name: &str,
        rows: usize,
        dim: usize,
        device: &Device,
    ) -> Result<Self> {
        Self::new(&file.get(name, &[rows, dim])?, device)
    }

    /// Rows in the table.
    /// This table converted to `dtype`: lookups then return `dtype` rows.
    pub fn with_dtype(&self, dtype: ComputeDType) -> Result<Self> {
        Ok(Self {
            table: self.table.to_dtype(dtype.dtype())?,
        })
    }

    pub fn rows(&self) -> usize {
        self.table.dims()[0]
    }

    /// Width of one row.
    pub fn dim(&self) -> usize {
        self.table.dims()[1]
    }

    /// The table itself (`[rows, dim]`).
    pub fn table(&self) -> &Tensor {
        &self.table
    }

    /// The rows picked by `ids` (checked to be in range), shaped `shape + [dim]`.
    pub fn forward(&self, ids: &[i64], shape: &[usize]) -> Result<Tensor> {
        Ok(self.table.embedding(ids, shape)?)
    }
}
