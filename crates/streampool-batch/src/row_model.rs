//! A ready [`BatchModel`] for models that map `[batch, features]` to `[batch, out]`.

use streampool::{Device, Tensor};

use crate::{BatchContext, BatchModel, ModelError};

/// Adapts a row-wise tensor function (an MLP, a classifier head, ...) to the batch queue:
/// each request is one row of `in_features` values; a batch is stacked into one
/// `[batch, in_features]` tensor on `device`, run through `forward` on the worker's stream,
/// and the `[batch, out]` result is split back into one row per caller.
///
/// ```
/// use std::sync::Arc;
/// use streampool::{Device, Tensor};
/// use streampool_batch::{BatchConfig, BatchQueue, RowModel};
///
/// let dev = Device::cpu();
/// let w = Tensor::from_vec(vec![1.0f32, 0.0, 0.0, 2.0], &[2, 2], &dev).unwrap();
/// let model = RowModel::new(dev, 2, move |x: &Tensor| x.matmul(&w));
/// let queue = BatchQueue::new(model, BatchConfig::default()).unwrap();
/// assert_eq!(queue.infer(vec![3.0, 4.0]).unwrap(), vec![3.0, 8.0]);
/// ```
pub struct RowModel<F> {
    device: Device,
    in_features: usize,
    forward: F,
}

impl<F> RowModel<F>
where
    F: Fn(&Tensor) -> streampool::Result<Tensor> + Send + Sync + 'static,
{
    /// `forward` maps a `[batch, in_features]` `f32` tensor on `device` to a `[batch, out]`
    /// one. It is called from worker threads, each with its own current stream.
    pub fn new(device: Device, in_features: usize, forward: F) -> Self {
        Self {
            device,
            in_features,
            forward,
        }
    }

    /// Features per input row.
    pub fn in_features(&self) -> usize {
        self.in_features
    }
}

impl<F> BatchModel for RowModel<F>
where
    F: Fn(&Tensor) -> streampool::Result<Tensor> + Send + Sync + 'static,
{
    type Input = Vec<f32>;
    type Output = Vec<f32>;

    fn forward_batch(
        &self,
        rows: Vec<Vec<f32>>,
        _ctx: &BatchContext,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let n = rows.len();
        let mut data = Vec::with_capacity(n * self.in_features);
        for row in &rows {
            if row.len() != self.in_features {
                return Err(
                    format!("row of {} values, expected {}", row.len(), self.in_features).into(),
                );
            }
            data.extend_from_slice(row);
        }
        let x = Tensor::from_vec(data, &[n, self.in_features], &self.device)?;
        let y = (self.forward)(&x)?;
        let out = match y.dims() {
            [rows_out, out] if *rows_out == n => *out,
            dims => {
                return Err(format!("forward returned shape {dims:?} for {n} rows").into());
            }
        };
        if out == 0 {
            return Ok(vec![Vec::new(); n]);
        }
        let values = y.to_vec::<f32>()?;
        Ok(values.chunks(out).map(<[f32]>::to_vec).collect())
    }

    fn check_input(&self, row: &Vec<f32>) -> Result<(), ModelError> {
        if row.len() != self.in_features {
            return Err(
                format!("row of {} values, expected {}", row.len(), self.in_features).into(),
            );
        }
        Ok(())
    }

    fn device(&self) -> Option<Device> {
        Some(self.device.clone())
    }
}
