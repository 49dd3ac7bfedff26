//! Size classes: requests are rounded up so freed blocks fit later requests of similar size.

/// Smallest block handed out.
pub const MIN_BLOCK: usize = 512;

/// Rounds `bytes` up to its size class: 512 bytes at least, then four classes per power of
/// two (so at most 25% of a block is slack).
///
/// ```
/// use streampool::allocator::size_class;
/// assert_eq!(size_class(1), 512);
/// assert_eq!(size_class(1000), 1024);
/// assert_eq!(size_class(1025), 1280);
/// assert_eq!(size_class(4096), 4096);
/// ```
pub fn size_class(bytes: usize) -> usize {
    if bytes <= MIN_BLOCK {
        return MIN_BLOCK;
    }
    let k = usize::BITS - 1 - bytes.leading_zeros(); // floor(log2(bytes))
    let step = (1usize << k) / 4;
    bytes.div_ceil(step) * step
}

/// The dense index of size class `size` (a value [`size_class`] returns): 0 for 512, then
/// one per class in increasing order. Free lists are a vector indexed by it (no hashing on
/// the per-op path).
pub(crate) fn class_index(size: usize) -> usize {
    debug_assert_eq!(size_class(size), size, "{size} is not a size class");
    // A class is `m << j` with `m` in 4..8 and `j >= 7` (512 = 4 << 7).
    let j = (usize::BITS - 1 - size.leading_zeros()) as usize - 2;
    4 * (j - 7) + (size >> j) - 4
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_indices_are_dense_and_increasing() {
        let mut classes: Vec<usize> = (1..3_000_000).step_by(97).map(size_class).collect();
        classes.dedup();
        assert_eq!(class_index(MIN_BLOCK), 0);
        for w in classes.windows(2) {
            assert_eq!(
                class_index(w[1]),
                class_index(w[0]) + 1,
                "{} -> {}",
                w[0],
                w[1]
            );
        }
        assert_eq!(class_index(1 << 40), 4 * (38 - 7));
    }

    #[test]
    fn classes_cover_requests_with_bounded_slack() {
        for bytes in (1..200_000).step_by(37) {
            let c = size_class(bytes);
            assert!(c >= bytes);
            assert!(c <= MIN_BLOCK.max(bytes + bytes / 4), "{bytes} -> {c}");
            assert_eq!(size_class(c), c, "classes are fixed points");
        }
    }
}
