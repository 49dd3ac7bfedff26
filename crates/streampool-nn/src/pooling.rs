//! Sentence pooling as sentence-transformers does it: mean, first token or last token, then
//! L2 normalisation where the model has a `Normalize` module.

use streampool::Tensor;

use crate::{Error, Result};

/// Mean of `hidden: [batch, seq, dim]` over the positions where `mask` (`[batch, seq]`,
/// row-major, 1 = token, 0 = padding) is 1; a row with no tokens gives zeros. Returns
/// `[batch, dim]`.
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::pooling::mean_pool;
/// let h = Tensor::from_vec(vec![1.0f32, 3.0, 100.0], &[1, 3, 1], &Device::cpu()).unwrap();
/// let m = mean_pool(&h, &[1, 1, 0]).unwrap();
/// assert_eq!(m.to_vec::<f32>().unwrap(), vec![2.0]);
/// ```
pub fn mean_pool(hidden: &Tensor, mask: &[i64]) -> Result<Tensor> {
    let &[batch, seq, _] = hidden.dims() else {
        return Err(Error::Input(format!(
            "mean_pool takes [batch, seq, dim], got {:?}",
            hidden.dims()
        )));
    };
    if mask.len() != batch * seq {
        return Err(Error::Input(format!(
            "mean_pool: mask has {} values for hidden {:?}",
            mask.len(),
            hidden.dims()
        )));
    }
    let device = hidden.device();
    let weights: Vec<f32> = mask.iter().map(|&m| (m != 0) as u8 as f32).collect();
    // sentence-transformers clamps the token count at 1e-9 so an empty row divides safely.
    let counts: Vec<f32> = weights
        .chunks_exact(seq.max(1))
        .map(|row| row.iter().sum::<f32>().max(1e-9))
        .collect();
    let weights = Tensor::from_vec(weights, &[batch, seq, 1], device)?;
    let counts = Tensor::from_vec(counts, &[batch, 1], device)?;
    Ok(hidden.mul(&weights)?.sum(1, false)?.div(&counts)?)
}

/// Each row of `x: [batch, dim]` divided by its Euclidean norm (at least 1e-12, as
/// `torch.nn.functional.normalize`).
///
/// ```
/// use streampool::{Device, Tensor};
/// use streampool_nn::pooling::l2_normalize;
/// let x = Tensor::from_vec(vec![3.0f32, 4.0], &[1, 2], &Device::cpu()).unwrap();
/// assert_eq!(l2_normalize(&x).unwrap().to_vec::<f32>().unwrap(), vec![0.6, 0.8]);
/// ```
pub fn l2_normalize(x: &Tensor) -> Result<Tensor> {
    if x.rank() != 2 {
        return Err(Error::Input(format!(
            "l2_normalize takes [batch, dim], got {:?}",
            x.dims()
        )));
    }
    let floor = Tensor::full(1e-12, &[1], x.device())?;
    let norm = x.sqr()?.sum(1, true)?.sqrt()?.maximum(&floor)?;
    Ok(x.div(&norm)?)
}

/// How a sentence-transformers model turns hidden states into one vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The mean over real tokens (all-MiniLM-L6-v2, all-mpnet-base-v2).
    Mean,
    /// The first token, `[CLS]` / `<s>` (bge, gte).
    Cls,
    /// The last real token (decoder embedders: Qwen3-Embedding).
    LastToken,
}

/// A model's pooling, from its sentence-transformers files: the mode of
/// `1_Pooling/config.json` (the module `modules.json` names) and whether `modules.json` has a
/// `Normalize` module. A folder without `modules.json` pools by the mean and normalizes (what
/// this crate has always done, and all-MiniLM-L6-v2's modules).
///
/// ```
/// use streampool_nn::pooling::{Pooling, PoolingMode};
/// use streampool_nn::tiny_bert_dir;
/// let p = Pooling::from_dir(&tiny_bert_dir()).unwrap(); // no modules.json
/// assert_eq!(p, Pooling { mode: PoolingMode::Mean, normalize: true });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pooling {
    /// Which tokens make the vector.
    pub mode: PoolingMode,
    /// Scaled to unit length (a `Normalize` module).
    pub normalize: bool,
}

impl Pooling {
    /// Reads `dir/modules.json` and the pooling module's `config.json`.
    pub fn from_dir(dir: &std::path::Path) -> Result<Self> {
        let modules_path = dir.join("modules.json");
        if !modules_path.is_file() {
            return Ok(Self {
                mode: PoolingMode::Mean,
                normalize: true,
            });
        }
        let modules = read_json(&modules_path)?;
        let modules = modules.as_array().ok_or_else(|| {
            Error::Config(format!("{}: not a list of modules", modules_path.display()))
        })?;
        let kind = |m: &serde_json::Value| m["type"].as_str().unwrap_or("").to_string();
        let normalize = modules.iter().any(|m| kind(m).ends_with("Normalize"));
        let Some(pool) = modules.iter().find(|m| kind(m).ends_with("Pooling")) else {
            return Err(Error::Config(format!(
                "{}: no Pooling module (only sentence-transformers' Transformer + Pooling \
                 [+ Normalize] pipelines are supported)",
                modules_path.display()
            )));
        };
        let path = dir
            .join(pool["path"].as_str().unwrap_or("1_Pooling"))
            .join("config.json");
        let cfg = read_json(&path)?;
        let on = |key: &str| cfg[key].as_bool().unwrap_or(false);
        let modes = [
            ("pooling_mode_mean_tokens", PoolingMode::Mean),
            ("pooling_mode_cls_token", PoolingMode::Cls),
            ("pooling_mode_lasttoken", PoolingMode::LastToken),
        ];
        let chosen: Vec<PoolingMode> = modes.iter().filter(|(k, _)| on(k)).map(|m| m.1).collect();
        let unsupported = [
            "pooling_mode_max_tokens",
            "pooling_mode_mean_sqrt_len_tokens",
            "pooling_mode_weightedmean_tokens",
        ];
        if let Some(k) = unsupported.iter().find(|k| on(k)) {
            return Err(Error::Config(format!(
                "{}: {k} is not supported (mean, cls and lasttoken are)",
                path.display()
            )));
        }
        if cfg["include_prompt"].as_bool() == Some(false) {
            return Err(Error::Config(format!(
                "{}: include_prompt false (pooling without the prompt's tokens) is not supported",
                path.display()
            )));
        }
        match chosen[..] {
            [mode] => Ok(Self { mode, normalize }),
            _ => Err(Error::Config(format!(
                "{}: exactly one of mean, cls or lasttoken pooling must be on, got {chosen:?}",
                path.display()
            ))),
        }
    }

    /// Pools `hidden: [batch, seq, dim]` (any float dtype) over `mask` (`[batch, seq]`
    /// row-major, 1 = token) into `F32` `[batch, dim]`, normalized when `normalize`.
    ///
    /// ```
    /// use streampool::{Device, Tensor};
    /// use streampool_nn::pooling::{Pooling, PoolingMode};
    /// let h = Tensor::from_vec(vec![1.0f32, 3.0, 100.0], &[1, 3, 1], &Device::cpu()).unwrap();
    /// let last = Pooling { mode: PoolingMode::LastToken, normalize: false };
    /// assert_eq!(last.pool(&h, &[1, 1, 0], false).unwrap().to_vec::<f32>().unwrap(), vec![3.0]);
    /// let cls = Pooling { mode: PoolingMode::Cls, normalize: false };
    /// assert_eq!(cls.pool(&h, &[1, 1, 0], false).unwrap().to_vec::<f32>().unwrap(), vec![1.0]);
    /// ```
    pub fn pool(&self, hidden: &Tensor, mask: &[i64], normalize: bool) -> Result<Tensor> {
        let &[batch, seq, dim] = hidden.dims() else {
            return Err(Error::Input(format!(
                "pooling takes [batch, seq, dim], got {:?}",
                hidden.dims()
            )));
        };
        if mask.len() != batch * seq {
            return Err(Error::Input(format!(
                "pooling: mask has {} values for hidden {:?}",
                mask.len(),
                hidden.dims()
            )));
        }
        let pooled = match self.mode {
            PoolingMode::Mean => {
                if normalize && hidden.dtype() != streampool::DType::F32 {
                    // One fused kernel (mean, normalize, f32 out) for half precision.
                    // A batch without padding gets its mask filled on the device (no host
                    // pass, no upload between the forward and this kernel).
                    let m = if crate::scan::all_equal(mask, 1) {
                        Tensor::ones(&[batch, seq], hidden.device())?
                    } else {
                        let m: Vec<f32> = mask.iter().map(|&m| (m != 0) as u8 as f32).collect();
                        Tensor::from_vec(m, &[batch, seq], hidden.device())?
                    };
                    return Ok(hidden.mean_pool_normalize(&m)?);
                }
                mean_pool(&hidden.to_dtype(streampool::DType::F32)?, mask)?
            }
            PoolingMode::Cls => hidden.narrow(1, 0, 1)?.reshape(&[batch, dim])?,
            PoolingMode::LastToken => {
                // The last real token of each row, wherever the padding is (left or right).
                let rows: Vec<i64> = mask
                    .chunks_exact(seq.max(1))
                    .enumerate()
                    .map(|(b, row)| {
                        let last = row.iter().rposition(|&m| m != 0).unwrap_or(seq - 1);
                        (b * seq + last) as i64
                    })
                    .collect();
                hidden
                    .reshape(&[batch * seq, dim])?
                    .embedding(&rows, &[batch])?
            }
        };
        let pooled = pooled.to_dtype(streampool::DType::F32)?;
        if normalize {
            l2_normalize(&pooled)
        } else {
            Ok(pooled)
        }
    }
}

/// Parses the JSON file at `path`.
pub(crate) fn read_json(path: &std::path::Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|source| Error::Json {
        path: path.to_path_buf(),
        source,
    })
}
