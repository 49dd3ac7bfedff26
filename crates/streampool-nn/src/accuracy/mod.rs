//! The accuracy gate: how close a model in a reduced dtype stays to its own f32.
//!
//! A quantized model is only worth running if it keeps its meaning. The gate embeds a fixed
//! corpus ([`gate_corpus`]: 2,000 distinct English sentences of 2 to about 160 words in a
//! dozen topics, made by `scripts/make_gate_corpus.py` and committed) with the model in the
//! candidate dtype and in f32, and measures
//!
//! - the cosine between each sentence's two embeddings (the smallest and the mean), and
//! - retrieval agreement: for each sentence, how many of its 10 nearest neighbours within the
//!   corpus (by cosine, itself excluded) are the same under both embeddings, over 10,
//!   averaged over the corpus.
//!
//! [`AccuracyThresholds::default`] is what a quantized dtype must reach: min cosine >= 0.995,
//! mean >= 0.999, top-10 agreement >= 0.95.
//! [`SentenceEmbedder::load_with_options`](crate::SentenceEmbedder::load_with_options) runs
//! the gate when it loads a model in a quantized dtype and refuses one that fails, unless told to force it
//! ([`QuantizationGate::Force`]). What it measured is kept on disk ([`GateCache`], keyed by
//! the model's files, the dtype's arithmetic and this code), so only a machine's first load
//! of a model in a dtype pays for the measurement; later loads read the report and apply
//! their thresholds to it.
//!
//! ```
//! use streampool_nn::accuracy::{compare_embeddings, AccuracyThresholds};
//! let f32s = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![0.6, 0.8]];
//! let same = compare_embeddings(&f32s, &f32s, 1).unwrap();
//! assert_eq!((same.min_cosine, same.top_k_agreement), (1.0, 1.0));
//! assert!(same.passes(&AccuracyThresholds::default()));
//! ```

mod cache;

use std::fmt;

use crate::{ComputeDType, Error, Result, SentenceEmbedder};

pub use cache::GateCache;
pub(crate) use cache::GateStore;

/// How many nearest neighbours the retrieval agreement compares.
pub const GATE_TOP_K: usize = 10;

/// The committed corpus, one sentence per line.
const CORPUS: &str = include_str!("corpus.txt");

/// The gate's fixed corpus: 2,000 distinct sentences of mixed lengths (see the module docs).
///
/// ```
/// let corpus = streampool_nn::accuracy::gate_corpus();
/// assert_eq!(corpus.len(), 2000);
/// ```
pub fn gate_corpus() -> Vec<&'static str> {
    CORPUS.lines().filter(|l| !l.is_empty()).collect()
}

/// What a reduced dtype must reach against f32 on the gate corpus.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyThresholds {
    /// Smallest per-sentence cosine (default 0.995).
    pub min_cosine: f64,
    /// Mean per-sentence cosine (default 0.999).
    pub mean_cosine: f64,
    /// Mean top-10 nearest-neighbour overlap, 0 to 1 (default 0.95).
    pub top_k_agreement: f64,
}

impl Default for AccuracyThresholds {
    fn default() -> Self {
        Self {
            min_cosine: 0.995,
            mean_cosine: 0.999,
            top_k_agreement: 0.95,
        }
    }
}

/// What the gate measured (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccuracyReport {
    /// Sentences compared.
    pub sentences: usize,
    /// Smallest cosine between a sentence's two embeddings.
    pub min_cosine: f64,
    /// Mean of those cosines.
    pub mean_cosine: f64,
    /// Mean overlap of the `k` nearest neighbours, 0 to 1.
    pub top_k_agreement: f64,
    /// The `k` of `top_k_agreement` (at most the corpus size less one).
    pub k: usize,
}

impl AccuracyReport {
    /// Whether every measure reaches `t`.
    pub fn passes(&self, t: &AccuracyThresholds) -> bool {
        self.min_cosine >= t.min_cosine
            && self.mean_cosine >= t.mean_cosine
            && self.top_k_agreement >= t.top_k_agreement
    }
}

impl fmt::Display for AccuracyReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} sentences: min cosine {:.5}, mean cosine {:.6}, top-{} agreement {:.4}",
            self.sentences, self.min_cosine, self.mean_cosine, self.k, self.top_k_agreement
        )
    }
}

/// Whether loading a model in a quantized dtype runs the accuracy gate.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum QuantizationGate {
    /// Measure the model against its f32 on the gate corpus and refuse it
    /// ([`Error::AccuracyGate`]) when it misses the thresholds (the default).
    #[default]
    Enforce,
    /// Load without measuring: the caller vouches for the model (it measured it itself, or
    /// accepts the loss).
    Force,
}

/// How [`SentenceEmbedder::load_with_options`] loads a model.
///
/// ```
/// use streampool_nn::accuracy::{GateCache, QuantizationGate};
/// use streampool_nn::{ComputeDType, LoadOptions};
/// let opts = LoadOptions { dtype: ComputeDType::Int8, ..LoadOptions::default() };
/// assert_eq!((opts.gate, opts.gate_cache), (QuantizationGate::Enforce, GateCache::Default));
/// ```
#[derive(Debug, Clone, PartialEq, Default)]
pub struct LoadOptions {
    /// The compute dtype (default f32).
    pub dtype: ComputeDType,
    /// For a quantized dtype: whether the accuracy gate runs (default: enforced).
    pub gate: QuantizationGate,
    /// What the gate requires (default [`AccuracyThresholds::default`]).
    pub thresholds: AccuracyThresholds,
    /// Where the gate's measurements are kept between loads (default: streampool's cache
    /// folder, [`GateCache::Default`]).
    pub gate_cache: GateCache,
}

/// Compares two embeddings of the same sentences (`candidate[i]` and `reference[i]` embed
/// sentence `i`; any lengths, normalized here): per-sentence cosines and the overlap of each
/// sentence's `k` nearest neighbours (clamped to the corpus size less one).
///
/// # Errors
/// [`Error::Input`] when the two lists differ in length or an embedding is empty or of
/// another width.
pub fn compare_embeddings(
    reference: &[Vec<f32>],
    candidate: &[Vec<f32>],
    k: usize,
) -> Result<AccuracyReport> {
    let n = reference.len();
    if candidate.len() != n || n == 0 {
        return Err(Error::Input(format!(
            "accuracy: {} reference and {} candidate embeddings",
            n,
            candidate.len()
        )));
    }
    let dim = reference[0].len();
    if dim == 0 || reference.iter().chain(candidate).any(|e| e.len() != dim) {
        return Err(Error::Input(
            "accuracy: embeddings are empty or of different widths".into(),
        ));
    }
    let r = normalized(reference);
    let c = normalized(candidate);
    let cosines: Vec<f64> = r.iter().zip(&c).map(|(a, b)| dot(a, b)).collect();
    let min_cosine = cosines.iter().copied().fold(f64::INFINITY, f64::min);
    let mean_cosine = cosines.iter().sum::<f64>() / n as f64;
    let k = k.min(n - 1);
    let top_k_agreement = if k == 0 {
        1.0
    } else {
        use rayon::prelude::*;
        let overlap: usize = (0..n)
            .into_par_iter()
            .map(|i| {
                let a = nearest(&r, i, k);
                let b = nearest(&c, i, k);
                a.iter().filter(|j| b.contains(j)).count()
            })
            .sum();
        overlap as f64 / (n * k) as f64
    };
    Ok(AccuracyReport {
        sentences: n,
        min_cosine,
        mean_cosine,
        top_k_agreement,
        k,
    })
}

/// Embeds `texts` with both models and compares them ([`compare_embeddings`] with
/// [`GATE_TOP_K`] neighbours). The texts run in order of length, so that each device batch
/// pads little (the comparison does not depend on the order).
pub fn measure(
    reference: &SentenceEmbedder,
    candidate: &SentenceEmbedder,
    texts: &[&str],
) -> Result<AccuracyReport> {
    let mut order: Vec<usize> = (0..texts.len()).collect();
    order.sort_by_key(|&i| texts[i].len());
    let sorted: Vec<&str> = order.iter().map(|&i| texts[i]).collect();
    let r = reference.embed(&sorted)?;
    let c = candidate.embed(&sorted)?;
    compare_embeddings(&r, &c, GATE_TOP_K)
}

/// Unit-length `f64` copies (a zero vector stays zero).
fn normalized(e: &[Vec<f32>]) -> Vec<Vec<f64>> {
    e.iter()
        .map(|v| {
            let norm = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            let inv = if norm > 0.0 { 1.0 / norm } else { 0.0 };
            v.iter().map(|&x| f64::from(x) * inv).collect()
        })
        .collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// The `k` sentences most similar to sentence `i` (itself excluded), ties broken by index.
fn nearest(e: &[Vec<f64>], i: usize, k: usize) -> Vec<usize> {
    let mut sims: Vec<(f64, usize)> = e
        .iter()
        .enumerate()
        .filter(|&(j, _)| j != i)
        .map(|(j, v)| (dot(&e[i], v), j))
        .collect();
    let by = |a: &(f64, usize), b: &(f64, usize)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
    if k < sims.len() {
        sims.select_nth_unstable_by(k - 1, by);
        sims.truncate(k);
    }
    sims.into_iter().map(|(_, j)| j).collect()
}

/// Where a gate's report came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateSource {
    /// Measured by this load.
    Measured,
    /// Read from the [`GateCache`]: an earlier load measured the same files in the same
    /// arithmetic.
    Cached,
}

/// Refuses a report that misses `thresholds`.
pub(crate) fn enforce(
    report: AccuracyReport,
    dtype: ComputeDType,
    thresholds: &AccuracyThresholds,
) -> Result<AccuracyReport> {
    if !report.passes(thresholds) {
        return Err(Error::AccuracyGate {
            dtype,
            report,
            thresholds: *thresholds,
        });
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_corpus_is_distinct_sentences_of_mixed_lengths() {
        let c = gate_corpus();
        assert_eq!(c.len(), 2000);
        let distinct: std::collections::HashSet<_> = c.iter().collect();
        assert_eq!(distinct.len(), c.len());
        let words: Vec<usize> = c.iter().map(|s| s.split_whitespace().count()).collect();
        assert!(words.iter().any(|&w| w <= 3));
        assert!(words.iter().any(|&w| w >= 100));
    }

    #[test]
    fn agreement_counts_shared_neighbours() {
        // Four directions at 0, 10, 30 and 80 degrees; the candidate moves the last to 4.
        let at = |deg: f64| vec![deg.to_radians().cos() as f32, deg.to_radians().sin() as f32];
        let r = vec![at(0.0), at(10.0), at(30.0), at(80.0)];
        let mut c = r.clone();
        c[3] = at(4.0);
        let rep = compare_embeddings(&r, &c, 1).unwrap();
        // Nearest under r: 0->1, 1->0, 2->1, 3->2; under c: 0->3, 1->3, 2->1, 3->0.
        assert_eq!(rep.top_k_agreement, 0.25);
        assert!((rep.min_cosine - 76f64.to_radians().cos()).abs() < 1e-6);
        assert!(compare_embeddings(&r, &c[..3], 1).is_err());
        let t = AccuracyThresholds::default();
        assert!(!rep.passes(&t));
    }
}
