//! Packed batches: sequences of different lengths stored back to back, with no padding.

use crate::{BertInput, Error, Result};

/// A batch of token sequences of different lengths, concatenated (flash-attention's varlen
/// layout): `offsets[b]..offsets[b + 1]` are sequence `b`'s tokens. Every layer of
/// [`crate::BertModel::forward_packed`] runs over the `tokens` rows alone, so a batch of
/// lengths 8 and 256 costs what its 264 tokens cost, not 2 x 256.
///
/// ```
/// use streampool_nn::{BertInput, PackedInput};
/// let p = PackedInput::from_sequences(&[vec![101, 7, 102], vec![101, 102]]).unwrap();
/// assert_eq!((p.batch_size(), p.tokens(), p.max_len()), (2, 5, 3));
/// assert_eq!(p.offsets(), &[0, 3, 5]);
/// assert_eq!(p.positions(), &[0, 1, 2, 0, 1]);
/// // The same batch, padded: packing drops the padding again.
/// let padded = BertInput::from_sequences(&[vec![101, 7, 102], vec![101, 102]]).unwrap();
/// assert_eq!(PackedInput::from_padded(&padded).unwrap(), p);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedInput {
    input_ids: Vec<i64>,
    token_type_ids: Vec<i64>,
    /// Each token's position in its own sequence.
    positions: Vec<i64>,
    offsets: Vec<usize>,
    max_len: usize,
}

impl PackedInput {
    /// From the sequences' token ids (token types all 0). Empty sequences are allowed (their
    /// embeddings are zeros); an empty batch is not.
    pub fn from_sequences(sequences: &[Vec<i64>]) -> Result<Self> {
        let types: Vec<Vec<i64>> = sequences.iter().map(|s| vec![0; s.len()]).collect();
        Self::new(sequences, &types)
    }

    /// From the sequences' token ids and token type ids (one per token).
    pub fn new(sequences: &[Vec<i64>], token_types: &[Vec<i64>]) -> Result<Self> {
        if sequences.is_empty() {
            return Err(Error::Input(
                "a packed batch needs at least one sequence".into(),
            ));
        }
        if token_types.len() != sequences.len()
            || sequences
                .iter()
                .zip(token_types)
                .any(|(s, t)| s.len() != t.len())
        {
            return Err(Error::Input(
                "token_type_ids must have one value per token of every sequence".into(),
            ));
        }
        let tokens = sequences.iter().map(Vec::len).sum();
        let mut p = Self {
            input_ids: Vec::with_capacity(tokens),
            token_type_ids: Vec::with_capacity(tokens),
            positions: Vec::with_capacity(tokens),
            offsets: Vec::with_capacity(sequences.len() + 1),
            max_len: 0,
        };
        p.offsets.push(0);
        for (s, t) in sequences.iter().zip(token_types) {
            p.input_ids.extend(s);
            p.token_type_ids.extend(t);
            p.positions.extend(0..s.len() as i64);
            p.offsets.push(p.input_ids.len());
            p.max_len = p.max_len.max(s.len());
        }
        Ok(p)
    }

    /// The packed form of a right-padded batch: each row's tokens are its leading mask-1
    /// positions. `None` when a row's mask is not ones followed by zeros (a hole in the mask
    /// changes the positions of the tokens after it, which packing would renumber).
    pub fn from_padded(input: &BertInput) -> Option<Self> {
        let (b, s) = (input.batch_size(), input.seq_len());
        let mut ids = Vec::with_capacity(b);
        let mut types = Vec::with_capacity(b);
        for r in 0..b {
            let row = &input.attention_mask()[r * s..(r + 1) * s];
            let len = row.iter().take_while(|&&m| m == 1).count();
            if row[len..].iter().any(|&m| m != 0) {
                return None;
            }
            ids.push(input.input_ids()[r * s..r * s + len].to_vec());
            types.push(input.token_type_ids()[r * s..r * s + len].to_vec());
        }
        Self::new(&ids, &types).ok()
    }

    /// Sequences in the batch.
    pub fn batch_size(&self) -> usize {
        self.offsets.len() - 1
    }
    /// Tokens in the batch (no padding).
    pub fn tokens(&self) -> usize {
        self.input_ids.len()
    }
    /// The longest sequence's length.
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    /// `batch + 1` offsets: sequence `b` is tokens `offsets[b]..offsets[b + 1]`.
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }
    /// Token ids, `[tokens]`.
    pub fn input_ids(&self) -> &[i64] {
        &self.input_ids
    }
    /// Segment ids, `[tokens]`.
    pub fn token_type_ids(&self) -> &[i64] {
        &self.token_type_ids
    }
    /// Each token's position within its sequence, `[tokens]`.
    pub fn positions(&self) -> &[i64] {
        &self.positions
    }
    /// This batch followed by sequences of padding tokens (id 0, type 0) of the given
    /// lengths (0: an empty sequence), for [`crate::ShapeBuckets::pad_packed`].
    pub(crate) fn with_filler_sequences(&self, lengths: &[usize]) -> Self {
        let extra: usize = lengths.iter().sum();
        let mut p = self.clone();
        p.input_ids.reserve(extra);
        p.token_type_ids.reserve(extra);
        p.positions.reserve(extra);
        for &len in lengths {
            p.input_ids.resize(p.input_ids.len() + len, 0);
            p.token_type_ids.resize(p.token_type_ids.len() + len, 0);
            p.positions.extend(0..len as i64);
            p.offsets.push(p.input_ids.len());
            p.max_len = p.max_len.max(len);
        }
        p
    }

    /// Whether packing saves anything: some sequence is shorter than the longest.
    pub fn has_padding(&self) -> bool {
        self.tokens() < self.batch_size() * self.max_len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holes_in_the_mask_do_not_pack_and_empty_rows_do() {
        let hole = BertInput::new(vec![1, 2, 3], vec![1, 0, 1], None, 1).unwrap();
        assert!(PackedInput::from_padded(&hole).is_none());
        let empty_row = BertInput::new(vec![1, 2, 0, 0], vec![1, 1, 0, 0], None, 2).unwrap();
        let p = PackedInput::from_padded(&empty_row).unwrap();
        assert_eq!((p.offsets(), p.max_len()), (&[0, 2, 2][..], 2));
        assert!(p.has_padding());
        assert!(PackedInput::from_sequences(&[]).is_err());
        assert!(PackedInput::new(&[vec![1, 2]], &[vec![0]]).is_err());
    }
}
