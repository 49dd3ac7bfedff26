#!/usr/bin/env python3
"""A plain float64 numpy BERT forward pass, and the tiny-bert reference it produces.

Why: streampool-nn's BERT must match a reference to < 1e-4 relative error (fp32).
This file is that reference: readable numpy, float64 throughout, no framework.
It is checked against sentence-transformers on all-MiniLM-L6-v2 by
scripts/minilm_reference.py, and run as a script it writes
crates/streampool-nn/tests/data/tiny_bert_reference.json for models/tiny-bert.

The model is Hugging Face's BertModel (post-norm) followed by sentence-transformers'
mean pooling and L2 normalisation:

  x = LayerNorm(word_emb[ids] + pos_emb[0..L] + type_emb[token_type_ids])
  for each layer:
      scores = (x Wq^T + bq)(x Wk^T + bk)^T / sqrt(head_dim) + mask_bias   (per head)
      mask_bias = (1 - attention_mask) * finfo(float64).min   (HF's convention; any
                  large negative, e.g. -10000, gives the same result once exp()
                  underflows to 0, which it does in fp32 as well)
      a = softmax(scores) (x Wv^T + bv), heads concatenated
      x = LayerNorm(x + a Wo^T + bo)
      x = LayerNorm(x + GELU(x Wi^T + bi) Wo2^T + bo2)     GELU(x) = x/2 (1 + erf(x/sqrt 2))
  embedding = normalize(sum_t mask_t x_t / sum_t mask_t)

Weights are read from safetensors (any float dtype) and upcast to float64; linear
weights are [out, in] like torch.nn.Linear. Tensor names have no "bert." prefix.

Usage: python3 scripts/bert_reference.py [--model models/tiny-bert] [--out FILE]
Needs: numpy, safetensors, tokenizers.
"""
import argparse
import hashlib
import json
import math
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent

# Fixed test sentences: short, long, punctuation, accents, numbers, an e-mail.
# The first one is also used for the per-layer hidden-state reference.
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "A stream pool lets many threads share one GPU without serializing every request "
    "behind a single queue, and without leaving cross-stream memory safety to the user.",
    "Rust has no global interpreter lock.",
    "Café crème, naïve résumé — déjà vu?",
    "GPU",
    "What is the capital of France? Paris is the capital of France.",
    "Antidisestablishmentarianism, 3.14159 and e-mail@example.com are tokenizer-heavy.",
]

_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x: np.ndarray) -> np.ndarray:
    """Exact (erf) GELU, as BERT's hidden_act "gelu"."""
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    var = ((x - mean) ** 2).mean(axis=-1, keepdims=True)  # biased variance, like torch
    return (x - mean) / np.sqrt(var + eps) * gamma + beta


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    return x @ w.T + b


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def load_model(model_dir: Path):
    """(config dict, weights as float64 numpy arrays)."""
    config = json.loads((model_dir / "config.json").read_text())
    weights = {k: v.astype(np.float64) for k, v in load_file(str(model_dir / "model.safetensors")).items()}
    return config, weights


def tokenize(model_dir: Path, sentences):
    """Token ids, attention mask and token type ids, padded to the batch's longest.

    MiniLM's tokenizer.json has padding Fixed(128) and truncation 128 baked in; we
    replace the padding with pad-to-longest (what sentence-transformers does) and keep
    the truncation (no test sentence comes near 128 tokens).
    """
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")  # length=None: longest
    enc = tok.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    types = np.array([e.type_ids for e in enc], dtype=np.int64)
    return ids, mask, types


def bert_forward(config, w, ids, mask, types):
    """Returns (last_hidden_state [B, L, H], hidden_states: list of num_layers+1 arrays)."""
    B, L = ids.shape
    H = config["hidden_size"]
    nh = config["num_attention_heads"]
    hd = H // nh
    eps = config["layer_norm_eps"]

    x = (w["embeddings.word_embeddings.weight"][ids]
         + w["embeddings.position_embeddings.weight"][np.arange(L)][None, :, :]
         + w["embeddings.token_type_embeddings.weight"][types])
    x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
    hidden_states = [x]

    # [B, 1, 1, L]: added to every head's scores for every query row.
    mask_bias = (1.0 - mask[:, None, None, :].astype(np.float64)) * np.finfo(np.float64).min

    def heads(t):  # [B, L, H] -> [B, nh, L, hd]
        return t.reshape(B, L, nh, hd).transpose(0, 2, 1, 3)

    for n in range(config["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        q = heads(linear(x, w[p + "attention.self.query.weight"], w[p + "attention.self.query.bias"]))
        k = heads(linear(x, w[p + "attention.self.key.weight"], w[p + "attention.self.key.bias"]))
        v = heads(linear(x, w[p + "attention.self.value.weight"], w[p + "attention.self.value.bias"]))
        scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(hd) + mask_bias
        ctx = (softmax(scores) @ v).transpose(0, 2, 1, 3).reshape(B, L, H)
        attn_out = linear(ctx, w[p + "attention.output.dense.weight"], w[p + "attention.output.dense.bias"])
        x = layer_norm(x + attn_out, w[p + "attention.output.LayerNorm.weight"],
                       w[p + "attention.output.LayerNorm.bias"], eps)
        inter = gelu(linear(x, w[p + "intermediate.dense.weight"], w[p + "intermediate.dense.bias"]))
        out = linear(inter, w[p + "output.dense.weight"], w[p + "output.dense.bias"])
        x = layer_norm(x + out, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps)
        hidden_states.append(x)
    return x, hidden_states


def mean_pool_normalize(hidden, mask):
    m = mask[:, :, None].astype(np.float64)
    pooled = (hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9)
    return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


def embed(model_dir: Path, sentences):
    """Everything a reference file needs, computed in float64."""
    config, w = load_model(model_dir)
    ids, mask, types = tokenize(model_dir, sentences)
    last, hidden_states = bert_forward(config, w, ids, mask, types)
    return config, ids, mask, types, last, hidden_states, mean_pool_normalize(last, mask)


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description="Write the float64 reference for models/tiny-bert.")
    ap.add_argument("--model", type=Path, default=REPO / "models/tiny-bert")
    ap.add_argument("--out", type=Path, default=REPO / "crates/streampool-nn/tests/data/tiny_bert_reference.json")
    args = ap.parse_args()

    config, ids, mask, types, last, hidden_states, emb = embed(args.model, SENTENCES)
    valid = int(mask[0].sum())
    ref = {
        "description": "float64 numpy reference (scripts/bert_reference.py) for models/tiny-bert: "
                       "BertModel forward, mean pooling over attention_mask, L2 normalisation. "
                       "Weights are the fp16 file's values upcast to float64.",
        "model": "models/tiny-bert",
        "model_sha256": sha256(args.model / "model.safetensors"),
        "tokenizer_sha256": sha256(args.model / "tokenizer.json"),
        "config": config,
        "attention_mask_convention": "additive (1 - mask) * finfo(float64).min on padded keys (HF); "
                                     "-10000 or finfo(float32).min give the same output",
        "padding": "right, [PAD]=0, to the longest sentence in the batch (all sentences in one batch)",
        "batch_seq_len": int(ids.shape[1]),
        "sentences": [
            {
                "text": text,
                "input_ids": ids[i].tolist(),
                "attention_mask": mask[i].tolist(),
                "token_type_ids": types[i].tolist(),
                "embedding": emb[i].tolist(),
            }
            for i, text in enumerate(SENTENCES)
        ],
        "first_sentence": {
            "note": "rows are all batch_seq_len positions (padded ones too, as computed in the batch); "
                    "only the first valid_len rows enter the pooled embedding",
            "valid_len": valid,
            "last_hidden_state": last[0].tolist(),
            "hidden_states": [h[0].tolist() for h in hidden_states],
            "hidden_states_note": "index 0 = embeddings after LayerNorm, index n = output of layer n-1 "
                                  "(HF output_hidden_states); the last equals last_hidden_state",
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(ref, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes), seq_len {ids.shape[1]}, "
          f"first sentence {valid} tokens")


if __name__ == "__main__":
    main()
