//! Rows of token ids into one padded batch: every row of a run of texts in one buffer (no
//! `Vec` per sentence), then the padded `[batch, seq]` ids and mask written in place.

use rayon::prelude::*;

use crate::{BertInput, Result};

/// How a batch is padded (from the tokenizer's padding settings; the length is always the
/// batch's longest row, rounded up to `multiple` when set).
#[derive(Debug, Clone)]
pub(super) struct Padding {
    pub id: u32,
    pub left: bool,
    pub multiple: Option<usize>,
}

/// The ids of a run of texts, concatenated, and where each text's ids end.
#[derive(Debug, Default)]
pub(super) struct Rows {
    ids: Vec<u32>,
    ends: Vec<usize>,
}

impl Rows {
    pub fn with_capacity(rows: usize, ids: usize) -> Self {
        Self {
            ids: Vec::with_capacity(ids),
            ends: Vec::with_capacity(rows),
        }
    }

    /// The buffer the next row's ids are appended to.
    pub fn ids_mut(&mut self) -> &mut Vec<u32> {
        &mut self.ids
    }

    /// Ends the row whose ids were appended since the last call.
    pub fn end_row(&mut self) {
        self.ends.push(self.ids.len());
    }

    fn len(&self) -> usize {
        self.ends.len()
    }

    fn row(&self, i: usize) -> &[u32] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.ids[start..self.ends[i]]
    }

    fn longest(&self) -> usize {
        (0..self.len())
            .map(|i| self.row(i).len())
            .max()
            .unwrap_or(0)
    }
}

/// The padded batch of `parts`' rows, in order: ids (pad id where padded), mask (1 for
/// tokens), all-zero token types. `parallel`: fill the parts' rows on the current rayon
/// pool (call it from inside [`super::TokenizePool::install`]).
pub(super) fn assemble(parts: &[Rows], padding: &Padding, parallel: bool) -> Result<BertInput> {
    let rows: usize = parts.iter().map(Rows::len).sum();
    let mut seq = parts.iter().map(Rows::longest).max().unwrap_or(0);
    if let Some(m) = padding.multiple.filter(|&m| m > 0) {
        seq = seq.div_ceil(m) * m;
    }
    if seq == 0 {
        // Every text tokenized to nothing (a tokenizer without special tokens): the error
        // `BertInput` gives for an empty batch.
        return BertInput::new(Vec::new(), Vec::new(), None, rows);
    }
    let mut ids = vec![i64::from(padding.id); rows * seq];
    let mut mask = vec![0i64; rows * seq];
    let mut slices = Vec::with_capacity(parts.len());
    let (mut ids_rest, mut mask_rest) = (&mut ids[..], &mut mask[..]);
    for part in parts {
        let n = part.len() * seq;
        let (ids_part, ids_tail) = ids_rest.split_at_mut(n);
        let (mask_part, mask_tail) = mask_rest.split_at_mut(n);
        slices.push((part, ids_part, mask_part));
        (ids_rest, mask_rest) = (ids_tail, mask_tail);
    }
    let fill = |(part, ids, mask): (&Rows, &mut [i64], &mut [i64])| {
        let rows = ids.chunks_exact_mut(seq).zip(mask.chunks_exact_mut(seq));
        for (i, (ids_row, mask_row)) in rows.enumerate() {
            let row = part.row(i);
            let at = if padding.left { seq - row.len() } else { 0 };
            for (dst, &id) in ids_row[at..at + row.len()].iter_mut().zip(row) {
                *dst = i64::from(id);
            }
            mask_row[at..at + row.len()].fill(1);
        }
    };
    if parallel {
        slices.into_par_iter().for_each(fill);
    } else {
        slices.into_iter().for_each(fill);
    }
    BertInput::new(ids, mask, None, rows)
}
