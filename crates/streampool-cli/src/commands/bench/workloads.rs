//! The models under test: the small MLP and a sentence encoder at a fixed sequence length.
//!
//! Each workload can be called directly (`call`: one forward of `rows` requests, result read
//! back to the host) and is a [`BatchModel`], so the same work runs through a `BatchQueue`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use streampool::{Device, GraphCache};
use streampool_batch::{BatchContext, BatchModel, ModelError};
use streampool_nn::{
    find_minilm, find_tiny_bert, Activation, BertInput, BertModel, BertTokenizer, ComputeDType,
    HostTensor, Linear, LinearParams, Mlp, SentenceEmbedder,
};

/// Input and hidden widths of the benchmark MLP (256-1024-GELU-256).
pub const MLP_IN: usize = 256;
const MLP_HIDDEN: usize = 1024;
/// Distinct input rows callers cycle through (so not every call sends the same bytes).
const INPUT_POOL: usize = 512;

/// Words that are one WordPiece token each in the BERT uncased vocabulary, so a sentence of
/// `n` of them tokenizes to exactly `n + 2` tokens ([CLS] ... [SEP]). `bench/torch_baseline.py`
/// builds the same sentences from the same list and formula.
const WORDS: [&str; 16] = [
    "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "in", "park", "with", "big", "red",
    "ball", "today",
];

/// Sentence `i` of `seq` tokens (special tokens included).
pub fn sentence(i: usize, seq: usize) -> String {
    (0..seq.saturating_sub(2))
        .map(|k| WORDS[(i * 7 + k * 3 + (i / 16) * k) % WORDS.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Sentence `i` grown from [`WORDS`] to exactly `seq` tokens as `tokens` counts them
/// (special tokens included): words that would overshoot are skipped.
fn fitted_sentence(
    i: usize,
    seq: usize,
    tokens: &impl Fn(&str) -> Result<usize>,
) -> Result<String> {
    let mut words: Vec<&str> = Vec::new();
    let mut n = tokens("")?;
    for k in 0..8 * seq + WORDS.len() {
        if n == seq {
            return Ok(words.join(" "));
        }
        let w = WORDS[(i * 7 + k * 3 + (i / 16) * k) % WORDS.len()];
        words.push(w);
        let m = tokens(&words.join(" "))?;
        if m <= seq {
            n = m;
        } else {
            words.pop();
        }
    }
    // Then single characters (words of small vocabularies take several tokens each), as
    // words or glued to the last one, until the count is exact.
    let mut text = words.join(" ");
    'fill: while n < seq {
        for c in "abcdefghijklmnopqrstuvwxyz0123456789.,!?".chars() {
            for glue in ["", " "] {
                let candidate = format!("{text}{glue}{c}");
                let m = tokens(&candidate)?;
                if m <= seq && m > n {
                    (text, n) = (candidate, m);
                    continue 'fill;
                }
            }
        }
        break;
    }
    if n == seq {
        return Ok(text);
    }
    bail!("no synthetic sentence of exactly {seq} tokens with this tokenizer (got {n})")
}

/// The mixed-length workload (`minilm-mix`): sentence `i` has `mix_lengths(n)[i]` tokens.
const MIX_MIN: usize = 8;
const MIX_MAX: usize = 256;
const MIX_SEED: u64 = 20;

/// Token counts (special tokens included) of the mixed-length workload's first `n` sentences:
/// `8 + floor(249 u^3)` with `u` uniform in [0, 1) from the LCG of [`values`] (seed 20), so
/// lengths run from 8 to 256 with a long tail: median 39, mean 70, one in five over 128
/// tokens (at 512 sentences). `bench/torch_baseline.py` computes the same integers
/// (`mix_lengths`: `u` has 24 bits and the product is evaluated in the same order in f64).
pub fn mix_lengths(n: usize) -> Vec<usize> {
    let step = |s: u64| {
        s.wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407)
    };
    let mut s = step(MIX_SEED);
    (0..n)
        .map(|_| {
            s = step(s);
            let u = (s >> 40) as f64 / (1u64 << 24) as f64;
            MIX_MIN + ((MIX_MAX - MIX_MIN + 1) as f64 * u * u * u) as usize
        })
        .collect()
}

/// Deterministic values in [-1, 1) (a 64-bit LCG), for weights and inputs.
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// The MLP 256-1024-GELU-256 with fixed pseudo-random weights, shared by every caller.
/// Its forward runs through a CUDA graph per (stream, batch size) where the device has
/// them (`STREAMPOOL_GRAPHS=0` turns that off).
pub struct MlpWorkload {
    device: Device,
    mlp: Mlp,
    inputs: Vec<f32>,
    graphs: GraphCache,
}

impl MlpWorkload {
    /// Builds the model on `device`.
    pub fn new(device: &Device) -> Result<Self> {
        let linear = |out: usize, inp: usize, seed: u64| -> Result<Linear> {
            let scale = 1.0 / (inp as f32).sqrt();
            let w = HostTensor::new(values(out * inp, seed, scale), &[out, inp])?;
            let b = HostTensor::new(values(out, seed + 1, 0.1), &[out])?;
            Ok(Linear::new(&LinearParams::new(w, Some(b))?, device)?)
        };
        let mlp = Mlp::new(
            linear(MLP_HIDDEN, MLP_IN, 1)?,
            Activation::Gelu,
            linear(MLP_IN, MLP_HIDDEN, 3)?,
        )?;
        Ok(Self {
            device: device.clone(),
            mlp,
            inputs: values(INPUT_POOL * MLP_IN, 9, 1.0),
            // Enough for every pool stream at a few batch sizes.
            graphs: GraphCache::new(256),
        })
    }

    /// Input row `i` (cycling through the pool).
    pub fn row(&self, i: usize) -> Vec<f32> {
        let at = (i % INPUT_POOL) * MLP_IN;
        self.inputs[at..at + MLP_IN].to_vec()
    }

    /// One forward of `rows` requests starting at request `first`: upload, forward, read back.
    pub fn call(&self, rows: usize, first: usize) -> Result<()> {
        let mut data = Vec::with_capacity(rows * MLP_IN);
        for r in 0..rows {
            data.extend(self.row(first + r));
        }
        self.run(data, rows).map_err(|e| anyhow::anyhow!(e))?;
        Ok(())
    }

    fn run(&self, data: Vec<f32>, rows: usize) -> Result<Vec<f32>, ModelError> {
        // Upload, forward and read-back as one graph per (stream, rows) where the device has
        // graphs: a replay is one graph launch and one event wait.
        let mut out = self.graphs.run_host(
            "mlp",
            &self.device,
            &[(&data[..], &[rows, MLP_IN][..])],
            |i| Ok::<_, streampool_nn::Error>(vec![self.mlp.forward(&i[0])?]),
        )?;
        Ok(out.remove(0))
    }
}

impl BatchModel for MlpWorkload {
    type Input = Vec<f32>;
    type Output = Vec<f32>;

    fn forward_batch(
        &self,
        rows: Vec<Vec<f32>>,
        _ctx: &BatchContext,
    ) -> Result<Vec<Vec<f32>>, ModelError> {
        let n = rows.len();
        let out = self.run(rows.concat(), n)?;
        Ok(out.chunks(MLP_IN).map(<[f32]>::to_vec).collect())
    }

    fn check_input(&self, row: &Vec<f32>) -> Result<(), ModelError> {
        if row.len() != MLP_IN {
            return Err(format!("row of {} values, expected {MLP_IN}", row.len()).into());
        }
        Ok(())
    }

    fn device(&self) -> Option<Device> {
        Some(self.device.clone())
    }
}

/// Which sentence encoder the MiniLM workloads load, and from where.
pub struct EncoderChoice {
    /// The model folder.
    pub dir: PathBuf,
    /// A short label for reports: `all-MiniLM-L6-v2` or `tiny-bert`.
    pub label: String,
}

/// `--minilm DIR` if given, else the installed all-MiniLM-L6-v2, else the shipped tiny-bert
/// (with a printed note).
pub fn choose_encoder(explicit: Option<PathBuf>) -> Result<EncoderChoice> {
    if let Some(dir) = explicit {
        // Any family's folder: labelled by its name (figures say which model they ran); a
        // MiniLM folder keeps the label earlier result files have.
        let name = dir.file_name().map_or_else(
            || dir.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        );
        let label = if name.to_ascii_lowercase().contains("minilm") {
            "all-MiniLM-L6-v2".to_string()
        } else {
            name
        };
        return Ok(EncoderChoice { dir, label });
    }
    match find_minilm() {
        Ok(dir) => Ok(EncoderChoice {
            dir,
            label: "all-MiniLM-L6-v2".into(),
        }),
        Err(e) => {
            eprintln!(
                "note: MiniLM not found ({e}); the minilm workloads use the shipped tiny-bert \
                 (2 layers, 32 wide), so their figures say nothing about MiniLM"
            );
            Ok(EncoderChoice {
                dir: find_tiny_bert()?,
                label: "tiny-bert".into(),
            })
        }
    }
}

/// A tokenization path of the encoder workloads (all give the same batch).
#[derive(Debug, Clone, Copy)]
pub enum Tokenize {
    /// What `embed` and `tokenize` do: the fast path, large batches on the tokenization pool.
    Pool,
    /// The fast path on the calling thread alone.
    Serial,
    /// `tokenizers`' own `encode_batch` (full encodings, its own rayon parallelism on rayon's
    /// global pool unless `TOKENIZERS_PARALLELISM` is false): the path before the fast path.
    Tokenizers,
}

/// A sentence encoder (tokenizer + BERT + pooling) fed sentences of exactly `seq` tokens.
/// Through a queue it runs the inference core's embedder (see the batching scenario), the
/// adapter the server runs.
pub struct EncoderWorkload {
    embedder: Arc<SentenceEmbedder>,
    sentences: Vec<String>,
    /// Tokens per sentence (the longest, for the mixed workload).
    pub seq: usize,
    /// The mixed-length workload (`minilm-mix`).
    pub mix: bool,
}

impl EncoderWorkload {
    /// Loads the encoder once (share it between sequence lengths with [`Self::with_seq`]);
    /// `chunk`: its [`SentenceEmbedder::with_chunk_size`]. The tokenizer truncates at the
    /// model's positions (512 for all-MiniLM-L6-v2) rather than `sentence_bert_config.json`'s
    /// `max_seq_length` (256), so the 512-token points run 512 tokens.
    pub fn load(
        device: &Device,
        choice: &EncoderChoice,
        dtype: ComputeDType,
        chunk: usize,
        buckets: Option<u32>,
    ) -> Result<Arc<SentenceEmbedder>> {
        let load = || -> Result<SentenceEmbedder> {
            let model = BertModel::load_with(device, &choice.dir, dtype)?;
            let max = model.config().max_position_embeddings;
            let tokenizer = BertTokenizer::from_file(choice.dir.join("tokenizer.json"), max)?;
            Ok(SentenceEmbedder::new(tokenizer, model)?)
        };
        let mut emb = load()
            .with_context(|| format!("loading {} as {dtype}", choice.dir.display()))?
            .with_chunk_size(chunk);
        if let Some(steps_per_octave) = buckets {
            emb = emb.with_shape_buckets(streampool_nn::ShapeBuckets { steps_per_octave });
        }
        Ok(Arc::new(emb))
    }

    /// The workload at `seq` tokens; checks that the sentences tokenize to exactly `seq`.
    pub fn with_seq(embedder: Arc<SentenceEmbedder>, seq: usize) -> Result<Self> {
        Self::with_lengths(embedder, vec![seq; INPUT_POOL], false)
    }

    /// The mixed-length workload `minilm-mix`: sentence `i` of [`mix_lengths`]`[i]` tokens.
    pub fn mixed(embedder: Arc<SentenceEmbedder>) -> Result<Self> {
        Self::with_lengths(embedder, mix_lengths(INPUT_POOL), true)
    }

    fn with_lengths(
        embedder: Arc<SentenceEmbedder>,
        lengths: Vec<usize>,
        mix: bool,
    ) -> Result<Self> {
        let tokens = |s: &str| -> Result<usize> { Ok(embedder.tokenize(&[s])?.seq_len()) };
        let mut sentences: Vec<String> = lengths
            .iter()
            .enumerate()
            .map(|(i, &n)| sentence(i, n))
            .collect();
        if tokens(&sentences[0])? != lengths[0] {
            // Not a one-word-one-token vocabulary (SentencePiece, BPE, a tiny vocabulary):
            // each sentence grows word by word to exactly its length instead.
            sentences = lengths
                .iter()
                .enumerate()
                .map(|(i, &n)| fitted_sentence(i, n, &tokens))
                .collect::<Result<_>>()?;
        }
        for (s, &want) in sentences.iter().zip(&lengths).take(16) {
            let got = tokens(s)?;
            if got != want {
                bail!("a synthetic sentence tokenized to {got} tokens, expected {want}");
            }
        }
        Ok(Self {
            embedder,
            sentences,
            seq: lengths.iter().copied().max().unwrap_or(0),
            mix,
        })
    }

    /// The compute dtype of the encoder.
    pub fn dtype(&self) -> ComputeDType {
        self.embedder.model().dtype()
    }

    /// Sentences `first..first + rows` tokenized into one batch (outside any timed loop).
    pub fn tokenized(&self, rows: usize, first: usize) -> Result<BertInput> {
        self.tokenized_by(rows, first, Tokenize::Pool)
    }

    /// [`Self::tokenized`] by one of the tokenization paths, to time them side by side.
    pub fn tokenized_by(&self, rows: usize, first: usize, how: Tokenize) -> Result<BertInput> {
        let texts: Vec<&str> = (0..rows)
            .map(|r| self.sentences[(first + r) % INPUT_POOL].as_str())
            .collect();
        let tok = self.embedder.tokenizer();
        Ok(match how {
            Tokenize::Pool => self.embedder.tokenize(&texts)?,
            Tokenize::Serial => tok.encode_batch_serial(&texts)?,
            Tokenize::Tokenizers => tok.encode_batch_general(&texts)?,
        })
    }

    /// One call on a tokenized batch: upload of the token ids and mask, forward, mean pool
    /// and normalize, read-back of the embeddings (what PyTorch's forward figure counts).
    pub fn forward(&self, input: &BertInput) -> Result<Vec<f32>> {
        Ok(self.embedder.embed_input(input)?.to_vec::<f32>()?)
    }

    /// [`Self::forward`] on the padded path whatever the batch (the mixed workload compares
    /// it with the packed path, which `forward` takes).
    pub fn forward_padded(&self, input: &BertInput) -> Result<Vec<f32>> {
        Ok(self.embedder.embed_input_padded(input)?.to_vec::<f32>()?)
    }

    /// The encoder.
    pub fn embedder(&self) -> &Arc<SentenceEmbedder> {
        &self.embedder
    }

    /// Sentence `i` (cycling through the pool).
    pub fn text(&self, i: usize) -> String {
        self.sentences[i % INPUT_POOL].clone()
    }

    /// One embedding call of `rows` sentences starting at `first`: tokenize, forward, pool,
    /// read back.
    pub fn call(&self, rows: usize, first: usize) -> Result<()> {
        let texts: Vec<&str> = (0..rows)
            .map(|r| self.sentences[(first + r) % INPUT_POOL].as_str())
            .collect();
        self.embedder.embed(&texts)?;
        Ok(())
    }
}

/// A workload of the run, by name.
#[derive(Clone)]
pub enum Workload {
    /// `mlp`.
    Mlp(Arc<MlpWorkload>),
    /// `minilm32`, `minilm128`.
    Encoder(Arc<EncoderWorkload>),
}

impl Workload {
    /// Frees what the workload's graphs hold on the device (its points are done): with
    /// every dtype's encoder loaded for the whole run, the graphs of earlier dtypes would
    /// otherwise keep tens of GB of pools (the f16 points ran out of the H100's 80 GB).
    pub fn release_graphs(&self) {
        if let Workload::Encoder(e) = self {
            e.embedder.model().clear_graphs();
        }
    }

    /// The name used in flags and reports.
    pub fn name(&self) -> String {
        match self {
            Workload::Mlp(_) => "mlp".into(),
            Workload::Encoder(e) if e.mix => "minilm-mix".into(),
            Workload::Encoder(e) => format!("minilm{}", e.seq),
        }
    }

    /// The compute dtype (the MLP is always f32).
    pub fn dtype(&self) -> ComputeDType {
        match self {
            Workload::Mlp(_) => ComputeDType::F32,
            Workload::Encoder(e) => e.dtype(),
        }
    }

    /// One direct call of `rows` requests starting at request `first`.
    pub fn call(&self, rows: usize, first: usize) -> Result<()> {
        match self {
            Workload::Mlp(m) => m.call(rows, first),
            Workload::Encoder(e) => e.call(rows, first),
        }
    }
}
