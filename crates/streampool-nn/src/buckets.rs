//! Shape buckets: batches padded up to a small set of shapes, so that a corpus or a server
//! meets a bounded number of them.
//!
//! On CUDA every new batch shape costs set-up that a repeated one does not: a cuBLASLt plan
//! and its algorithm choice per GEMM, new allocator sizes, and a CUDA graph captured per
//! shape. Without buckets a packed batch's shape is its exact token count, which a
//! mixed-length corpus almost never repeats, so every batch paid that set-up and none
//! replayed a graph. With buckets, sizes are rounded up on a geometric grid of
//! `steps_per_octave` steps between powers of two (8 by default: at most 1/8 more work,
//! about 1/16 on average), and sizes up to `steps_per_octave` stay exact.

use crate::{BertInput, PackedInput};

/// The longest filler sequence [`ShapeBuckets::pad_packed`] adds. The shape a packed batch
/// runs at is its token and sequence counts; how the filler tokens are split into sequences
/// is data. Every token's attention costs as many keys as its sequence is long, so fillers as
/// long as the batch's longest sequence (256 tokens, say) made a bucket's few percent more
/// tokens cost several times their share of the attention; short ones cost what the
/// tokens do. Not shorter: each sequence is at least one tile of query rows in the
/// attention kernels' grids, and one more row to pool.
pub const FILLER_SEQ_LEN: usize = 64;

/// How batch shapes are rounded up (see the module documentation). A typed setting of
/// [`crate::SentenceEmbedder::with_shape_buckets`].
///
/// ```
/// use streampool_nn::ShapeBuckets;
/// let b = ShapeBuckets::default();
/// assert_eq!((b.round(7), b.round(100), b.round(128), b.round(129)), (7, 104, 128, 144));
/// assert_eq!(ShapeBuckets::OFF.round(129), 129);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeBuckets {
    /// Steps between consecutive powers of two (a power of two itself; 0 turns bucketing
    /// off). More steps pad less and meet more shapes.
    pub steps_per_octave: u32,
}

impl Default for ShapeBuckets {
    fn default() -> Self {
        Self {
            steps_per_octave: 8,
        }
    }
}

impl ShapeBuckets {
    /// No bucketing: every batch runs at its own shape.
    pub const OFF: Self = Self {
        steps_per_octave: 0,
    };

    /// Whether sizes are rounded at all.
    pub fn enabled(&self) -> bool {
        self.steps_per_octave > 0
    }

    /// `n` rounded up to its bucket: unchanged up to `steps_per_octave` (and when off),
    /// else to the next multiple of `2^floor(log2 n) / steps_per_octave`.
    pub fn round(&self, n: usize) -> usize {
        let steps = self.steps_per_octave.next_power_of_two() as usize;
        if !self.enabled() || n <= steps {
            return n;
        }
        let octave = 1usize << (usize::BITS - 1 - n.leading_zeros());
        let step = (octave / steps).max(1);
        n.div_ceil(step) * step
    }

    /// `input` padded to its bucket shape, or `None` when it is already there: the length
    /// rounded up (at most to `max_len`, the model's positions) with masked padding, the
    /// rows rounded up with copies of the last row (computed and dropped: a real row keeps
    /// every kernel on the path real rows take). The first `input.batch_size()` rows of the
    /// result are `input`'s, with the same embeddings up to float rounding.
    pub fn pad_input(&self, input: &BertInput, max_len: usize) -> Option<BertInput> {
        let (b, s) = (input.batch_size(), input.seq_len());
        let rows = self.round(b);
        let len = self.round(s).min(max_len.max(s));
        if (rows, len) == (b, s) {
            return None;
        }
        let mut ids = Vec::with_capacity(rows * len);
        let mut mask = Vec::with_capacity(rows * len);
        let mut types = Vec::with_capacity(rows * len);
        for r in (0..b).chain(std::iter::repeat_n(b - 1, rows - b)) {
            let span = r * s..(r + 1) * s;
            ids.extend_from_slice(&input.input_ids()[span.clone()]);
            mask.extend_from_slice(&input.attention_mask()[span.clone()]);
            types.extend_from_slice(&input.token_type_ids()[span]);
            for v in [&mut ids, &mut mask, &mut types] {
                v.resize(v.len() + (len - s), 0);
            }
        }
        // Same row count and lengths as checked above: `new` cannot refuse it.
        BertInput::new(ids, mask, Some(types), rows).ok()
    }

    /// `input` padded to its bucket shape, or `None` when it is already there: the tokens
    /// rounded up by extra sequences of padding tokens, each at most [`FILLER_SEQ_LEN`] and
    /// `max_seq` long (the model's length bound for this batch, so the longest sequence
    /// stays the longest), then the sequence count rounded up by empty sequences. The first
    /// `input.batch_size()` sequences are `input`'s; the others are computed and dropped.
    pub fn pad_packed(&self, input: &PackedInput, max_seq: usize) -> Option<PackedInput> {
        if !self.enabled() {
            return None;
        }
        let (b, n) = (input.batch_size(), input.tokens());
        let tokens = self.round(n);
        let max_seq = max_seq.clamp(1, FILLER_SEQ_LEN);
        let fillers = (tokens - n).div_ceil(max_seq);
        let rows = self.round(b + fillers);
        if (rows, tokens) == (b, n) {
            return None;
        }
        let mut lengths = Vec::with_capacity(rows - b);
        let mut left = tokens - n;
        while left > 0 {
            let len = left.min(max_seq);
            lengths.push(len);
            left -= len;
        }
        lengths.resize(rows - b, 0);
        Some(input.with_filler_sequences(&lengths))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_monotone_bounded_and_exact_on_the_grid() {
        let b = ShapeBuckets::default();
        let mut last = 0;
        for n in 1..=70_000usize {
            let r = b.round(n);
            assert!(r >= n && r >= last, "{n} -> {r}");
            // At most one step (1/8 of the octave's start) more.
            assert!(r - n < n.div_ceil(8).max(1), "{n} -> {r}");
            assert_eq!(b.round(r), r, "a bucket is its own bucket");
            last = r;
        }
        for p in 0..16 {
            assert_eq!(b.round(1 << p), 1 << p);
        }
        // 8 buckets per octave past the first 8 sizes.
        let distinct = |lo: usize, hi: usize| {
            let mut v: Vec<usize> = (lo..=hi).map(|n| b.round(n)).collect();
            v.dedup();
            v.len()
        };
        assert_eq!(distinct(1, 8), 8);
        assert_eq!(distinct(257, 512), 8);
        assert_eq!(distinct(32_769, 65_536), 8);
        let coarse = ShapeBuckets {
            steps_per_octave: 4,
        };
        assert_eq!(
            (coarse.round(5), coarse.round(9), coarse.round(700)),
            (5, 10, 768)
        );
        assert_eq!(ShapeBuckets::OFF.round(12_345), 12_345);
    }
}
