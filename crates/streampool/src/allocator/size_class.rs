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

#[cfg(test)]
mod tests {
    use super::*;

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
