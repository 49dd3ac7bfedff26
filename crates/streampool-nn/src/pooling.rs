//! Sentence pooling: mean over real tokens, then L2 normalisation (as sentence-transformers).

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
