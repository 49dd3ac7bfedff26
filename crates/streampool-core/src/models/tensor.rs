//! Row-wise tensor models (`FP32 [N, in] -> FP32 [N, out]`), e.g. a small MLP, served
//! through one batch queue per replica.

use std::sync::Arc;
use std::time::Instant;

use streampool::{Device, Tensor};
use streampool_batch::{BatchModel, Replicas, RowModel};

use streampool_batch::BatchConfig;

use crate::{Error, Result};

/// A forward function over `[batch, in_features]` f32 tensors.
pub type ForwardFn = Arc<dyn Fn(&Tensor) -> streampool::Result<Tensor> + Send + Sync + 'static>;

/// A row-wise model to serve: each request row of `in_features` values maps to one row of
/// `out_features` values.
///
/// ```
/// use std::sync::Arc;
/// use streampool::Device;
/// use streampool_core::TensorModel;
/// let dbl = TensorModel::new(Device::cpu(), 2, 2, Arc::new(|x: &streampool::Tensor| x.scale(2.0)));
/// assert_eq!(dbl.in_features(), 2);
/// ```
#[derive(Clone)]
pub struct TensorModel {
    device: Device,
    in_features: usize,
    out_features: usize,
    forward: ForwardFn,
}

impl TensorModel {
    /// A model from its forward function; `forward` must map `[n, in_features]` to
    /// `[n, out_features]`.
    pub fn new(
        device: Device,
        in_features: usize,
        out_features: usize,
        forward: ForwardFn,
    ) -> Self {
        Self {
            device,
            in_features,
            out_features,
            forward,
        }
    }

    /// The demo MLP `relu(x W1) W2` (`width -> 4*width -> width`) with weights drawn from
    /// `seed` and scaled by `1/sqrt(fan_in)`: the same seed gives the same model, so a client
    /// can check the server's answers against its own copy.
    pub fn mlp(device: &Device, width: usize, seed: u64) -> streampool::Result<Self> {
        let hidden = 4 * width;
        let w1 =
            Tensor::randn(&[width, hidden], seed, device)?.scale(1.0 / (width as f32).sqrt())?;
        let w2 = Tensor::randn(&[hidden, width], seed.wrapping_add(1), device)?
            .scale(1.0 / (hidden as f32).sqrt())?;
        let forward: ForwardFn = Arc::new(move |x: &Tensor| x.matmul(&w1)?.relu()?.matmul(&w2));
        Ok(Self::new(device.clone(), width, width, forward))
    }

    /// Runs the model on the calling thread (the in-process reference for a batch of rows).
    pub fn forward(&self, x: &Tensor) -> streampool::Result<Tensor> {
        (self.forward)(x)
    }

    /// Values per input row.
    pub fn in_features(&self) -> usize {
        self.in_features
    }

    /// Values per output row.
    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The device it runs on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

type RowFn = Box<dyn Fn(&Tensor) -> streampool::Result<Tensor> + Send + Sync + 'static>;

/// One served tensor model and its replicas (one batch queue each).
pub struct TensorEndpoint {
    model: TensorModel,
    replicas: Replicas<RowModel<RowFn>>,
}

impl TensorEndpoint {
    /// Serves the `(device label, model)` replicas (one model on several devices) with the
    /// batch settings of `config`.
    pub fn new(models: Vec<(String, TensorModel)>, batch: &BatchConfig) -> Result<Self> {
        let Some((_, model)) = models.first() else {
            return Err(Error::Config(
                "a tensor model needs at least one replica".into(),
            ));
        };
        let model = model.clone();
        if model.in_features == 0 || model.out_features == 0 {
            return Err(Error::Config(
                "a tensor model needs at least one input and output feature".into(),
            ));
        }
        if models.iter().any(|(_, m)| {
            (m.in_features, m.out_features) != (model.in_features, model.out_features)
        }) {
            return Err(Error::Config(
                "replicas of one tensor model differ in shape".into(),
            ));
        }
        let rows = models.into_iter().map(|(label, m)| {
            let forward = m.forward.clone();
            let row_fn: RowFn = Box::new(move |x: &Tensor| forward(x));
            (
                label,
                RowModel::new(m.device.clone(), m.in_features, row_fn),
            )
        });
        let replicas = Replicas::new(rows, batch.clone())
            .map_err(|e| Error::Config(format!("starting the batch queues: {e}")))?;
        Ok(Self { model, replicas })
    }

    /// The served model (its first replica).
    pub fn model(&self) -> &TensorModel {
        &self.model
    }

    /// The replicas (their statistics, labels, load).
    pub fn replicas(&self) -> &Replicas<impl BatchModel> {
        &self.replicas
    }

    /// Runs `rows` through the queue; each output row is checked to have `out_features`
    /// values, all finite: a NaN or infinity (inputs that overflow the model's arithmetic)
    /// is [`Error::NonFinite`] for this request, never a `null` or `0.0` answered as success.
    /// Other requests of the same batch are unaffected.
    pub async fn infer(&self, rows: Vec<Vec<f32>>, deadline: Instant) -> Result<Vec<Vec<f32>>> {
        let out = super::run_all(&self.replicas, rows, deadline).await?;
        if let Some(bad) = out.iter().find(|r| r.len() != self.model.out_features) {
            return Err(Error::Model(format!(
                "model returned a row of {} values, expected {}",
                bad.len(),
                self.model.out_features
            )));
        }
        if let Some(row) = out.iter().position(|r| r.iter().any(|x| !x.is_finite())) {
            return Err(Error::NonFinite {
                input: row,
                message: "the model's output is not finite (NaN or infinity): the inputs \
                          overflow its f32 arithmetic"
                    .into(),
            });
        }
        Ok(out)
    }
}
