//! Element types.

/// The element type of a tensor. `F32`, `F16` and `BF16` are compute types: every
/// floating-point op runs on each of them, storing its output in the input's dtype and
/// computing in `f32` inside (half values are widened on load; sums and statistics
/// accumulate in `f32` or wider). `I64` holds indices (token ids).
///
/// `F16` overflows past 65504: an op whose result exceeds that stores `inf` (as PyTorch
/// does), so inputs of extreme magnitude should run in `BF16` or `F32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I64,
}

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
            DType::F16 | DType::BF16 => 2,
            DType::I64 => 8,
        }
    }

    /// Whether this is a floating-point (compute) type.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F16 | DType::BF16)
    }
}

/// A Rust type that can be stored in a tensor (sealed: `f32`, `i64`, `f16`, `bf16`).
///
/// ```
/// use streampool::{DType, Element};
/// assert_eq!(<f32 as Element>::DTYPE, DType::F32);
/// ```
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The matching [`DType`].
    const DTYPE: DType;
}

mod sealed {
    /// Only plain-old-data numeric types (no padding, every bit pattern valid) implement this.
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for i64 {}
    impl Sealed for half::f16 {}
    impl Sealed for half::bf16 {}
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}
impl Element for i64 {
    const DTYPE: DType = DType::I64;
}
impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}
impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

/// The bytes of a slice of elements.
pub(crate) fn as_bytes<T: Element>(s: &[T]) -> &[u8] {
    // SAFETY: `Element` is sealed to padding-free numeric types, so every byte is initialised.
    unsafe { std::slice::from_raw_parts(s.as_ptr().cast(), std::mem::size_of_val(s)) }
}

/// The bytes of a mutable slice of elements.
pub(crate) fn as_bytes_mut<T: Element>(s: &mut [T]) -> &mut [u8] {
    // SAFETY: as `as_bytes`; any byte pattern written back is a valid value of these types.
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}
