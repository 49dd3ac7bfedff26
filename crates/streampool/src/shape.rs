//! Shapes, strides and broadcasting: the bottom module that tensors, kernels and graphs
//! share (it knows nothing of them; `tensor` re-exports its public items).

use smallvec::SmallVec;

use crate::{Error, Result};

/// A shape or its strides. Held inline up to rank 4 (every tensor the models make), so
/// making an op's output allocates nothing for them; higher ranks spill to the heap.
///
/// ```
/// use streampool::tensor::Dims;
/// let d: Dims = Dims::from_slice(&[2, 3]);
/// assert_eq!(d.iter().product::<usize>(), 6);
/// assert!(!d.spilled());
/// ```
pub type Dims = SmallVec<[usize; 4]>;

/// Where a tensor's elements live inside its storage: `shape`, `strides` (in elements) and
/// the `offset` of element zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub shape: Dims,
    pub strides: Dims,
    pub offset: usize,
}

impl Layout {
    /// A contiguous row-major layout of `shape`.
    ///
    /// ```
    /// use streampool::tensor::Layout;
    /// let l = Layout::contiguous(&[2, 3]);
    /// assert_eq!((&l.strides[..], l.offset), (&[3, 1][..], 0));
    /// ```
    pub fn contiguous(shape: &[usize]) -> Self {
        Self {
            shape: Dims::from_slice(shape),
            strides: strides_of(shape),
            offset: 0,
        }
    }

    /// A contiguous row-major layout that takes `shape`.
    pub(crate) fn contiguous_owned(shape: Dims) -> Self {
        Self {
            strides: strides_of(&shape),
            shape,
            offset: 0,
        }
    }

    /// The number of elements (0 if any dim is 0, however large the others).
    pub fn elem_count(&self) -> usize {
        if self.shape.contains(&0) {
            return 0;
        }
        // Every tensor's shape passed `checked_elem_count` when it was made, and views never
        // grow it, so this product fits.
        self.shape.iter().product()
    }

    /// Whether elements are laid out row-major with no gaps (size-1 dims may have any stride;
    /// a layout with no elements always is).
    pub fn is_contiguous(&self) -> bool {
        // No elements, nothing to reorder (and the running product below could overflow).
        if self.elem_count() == 0 {
            return true;
        }
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
    pub fn broadcast_strides(&self, target: &[usize]) -> Result<Dims> {
        let extra = target.len().checked_sub(self.shape.len()).ok_or_else(|| {
            Error::shape(
                "broadcast",
                format!("cannot broadcast {:?} to {:?}", self.shape, target),
            )
        })?;
        let mut out = Dims::from_elem(0, target.len());
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
///
/// Saturates instead of overflowing: a zero-sized shape such as `[2^40, 2^40, 0]` is valid
/// but its outer strides do not fit a `usize`, and no element is ever addressed through them.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    strides_of(shape).into_vec()
}

/// [`contiguous_strides`], inline (no heap allocation up to rank 4).
fn strides_of(shape: &[usize]) -> Dims {
    let mut strides: Dims = SmallVec::from_elem(1, shape.len());
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
}

/// The number of elements of `shape`, or a shape error naming `op` when it does not fit a
/// `usize` (a shape with a 0 dim has no elements, however large the other dims).
pub(crate) fn checked_elem_count(op: &'static str, shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| Error::shape(op, format!("{shape:?} has too many elements")))
}

/// The bytes `shape` takes at `elem_size` bytes per element, or a shape error naming `op`
/// when that exceeds what any allocation can hold (`isize::MAX`).
pub(crate) fn checked_byte_size(
    op: &'static str,
    shape: &[usize],
    elem_size: usize,
) -> Result<usize> {
    checked_elem_count(op, shape)?
        .checked_mul(elem_size)
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| Error::shape(op, format!("{shape:?} is too large to allocate")))
}

/// The shape two operands broadcast to (NumPy rules), or a shape error naming `op`.
///
/// ```
/// use streampool::tensor::broadcast_shapes;
/// assert_eq!(broadcast_shapes("add", &[2, 1, 3], &[4, 3]).unwrap().as_slice(), &[2, 4, 3]);
/// assert!(broadcast_shapes("add", &[2, 3], &[4, 3]).is_err());
/// ```
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Dims> {
    let n = a.len().max(b.len());
    let mut out = Dims::from_elem(0, n);
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
