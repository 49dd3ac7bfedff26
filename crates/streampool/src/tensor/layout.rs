//! Shapes, strides and broadcasting.

use crate::{Error, Result};

/// Where a tensor's elements live inside its storage: `shape`, `strides` (in elements) and
/// the `offset` of element zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Layout {
    /// A contiguous row-major layout of `shape`.
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    pub fn elem_count(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether elements are laid out row-major with no gaps (size-1 dims may have any stride).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for (&d, &s) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d;
        }
        true
    }

    /// Strides that read this layout as if broadcast to `target` (zero on broadcast dims).
    pub fn broadcast_strides(&self, target: &[usize]) -> Result<Vec<usize>> {
        let extra = target.len().checked_sub(self.shape.len()).ok_or_else(|| {
            Error::shape(
                "broadcast",
                format!("cannot broadcast {:?} to {:?}", self.shape, target),
            )
        })?;
        let mut out = vec![0; target.len()];
        for (i, (&d, &s)) in self.shape.iter().zip(&self.strides).enumerate() {
            let t = target[extra + i];
            out[extra + i] = if d == t {
                s
            } else if d == 1 {
                0
            } else {
                return Err(Error::shape(
                    "broadcast",
                    format!("cannot broadcast {:?} to {:?}", self.shape, target),
                ));
            };
        }
        Ok(out)
    }
}

/// Row-major strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1];
    }
    strides
}

/// The shape two operands broadcast to (NumPy rules), or a shape error naming `op`.
///
/// ```
/// use streampool::tensor::broadcast_shapes;
/// assert_eq!(broadcast_shapes("add", &[2, 1, 3], &[4, 3]).unwrap(), vec![2, 4, 3]);
/// assert!(broadcast_shapes("add", &[2, 3], &[4, 3]).is_err());
/// ```
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::shape(
                    op,
                    format!("cannot broadcast {a:?} with {b:?}"),
                ))
            }
        };
    }
    Ok(out)
}
