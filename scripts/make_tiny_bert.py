#!/usr/bin/env python3
"""Generate models/tiny-bert/: a 2-layer, 32-wide BERT with random float16 weights.

Why: the Rust model crate (streampool-nn) needs a BERT checkpoint small enough to
commit and to run in CI in milliseconds, yet laid out exactly like the real model
it serves (sentence-transformers/all-MiniLM-L6-v2). So this writes:

  config.json        Hugging Face BertConfig, same keys as MiniLM's, small sizes
  model.safetensors  the same tensor names as MiniLM's model.safetensors (no
                     "bert." prefix, embeddings.position_ids as I64, pooler
                     included because MiniLM has it), float16, fixed seed
  tokenizer.json     copied unchanged from MiniLM (vocab 30522)

Weights: embeddings, pooler and biases follow BERT's init, N(0, 0.02) (biases
random rather than zero, so a forgotten bias shows). LayerNorm: gamma = 1 + N(0, 0.05),
beta = N(0, 0.05). The encoder's linear weights (Q, K, V, attention output,
intermediate, output) are N(0, 1/fan_in) instead of N(0, 0.02): at width 32, 0.02
makes attention almost uniform and the MLP almost linear, so a missing 1/sqrt(d)
scale or a transposed W_q moved the embedding by only ~1e-4 (measured); with
1/fan_in they move it by ~0.2, a missing mask by ~0.26, tanh-GELU by ~6e-5.

Usage: python3 scripts/make_tiny_bert.py [--minilm DIR] [--out models/tiny-bert]
  DIR defaults to the path in ${STREAMPOOL_CACHE:-~/.cache/streampool}/minilm.path
  (written by scripts/fetch-minilm.sh). Needs: numpy, safetensors.
"""
import argparse
import json
import os
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

SEED = 20261123
CONFIG = {
    "architectures": ["BertModel"],
    "attention_probs_dropout_prob": 0.1,
    "hidden_act": "gelu",
    "hidden_dropout_prob": 0.1,
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 64,
    "layer_norm_eps": 1e-12,
    "max_position_embeddings": 128,
    "model_type": "bert",
    "num_attention_heads": 2,
    "num_hidden_layers": 2,
    "pad_token_id": 0,
    "position_embedding_type": "absolute",
    "type_vocab_size": 2,
    "vocab_size": 30522,
}


def minilm_dir() -> Path:
    cache = Path(os.environ.get("STREAMPOOL_CACHE", Path.home() / ".cache/streampool"))
    path_file = cache / "minilm.path"
    if not path_file.exists():
        raise SystemExit(f"{path_file} not found: run scripts/fetch-minilm.sh first or pass --minilm")
    return Path(path_file.read_text().strip())


def tensor_shapes(c: dict) -> dict:
    """Name -> shape, in the Hugging Face BertModel layout (as in MiniLM's file)."""
    h, i = c["hidden_size"], c["intermediate_size"]
    shapes = {
        "embeddings.word_embeddings.weight": (c["vocab_size"], h),
        "embeddings.position_embeddings.weight": (c["max_position_embeddings"], h),
        "embeddings.token_type_embeddings.weight": (c["type_vocab_size"], h),
        "embeddings.LayerNorm.weight": (h,),
        "embeddings.LayerNorm.bias": (h,),
    }
    for n in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{n}."
        for name in ("query", "key", "value"):
            shapes[p + f"attention.self.{name}.weight"] = (h, h)  # [out, in], like torch Linear
            shapes[p + f"attention.self.{name}.bias"] = (h,)
        shapes[p + "attention.output.dense.weight"] = (h, h)
        shapes[p + "attention.output.dense.bias"] = (h,)
        shapes[p + "attention.output.LayerNorm.weight"] = (h,)
        shapes[p + "attention.output.LayerNorm.bias"] = (h,)
        shapes[p + "intermediate.dense.weight"] = (i, h)
        shapes[p + "intermediate.dense.bias"] = (i,)
        shapes[p + "output.dense.weight"] = (h, i)
        shapes[p + "output.dense.bias"] = (h,)
        shapes[p + "output.LayerNorm.weight"] = (h,)
        shapes[p + "output.LayerNorm.bias"] = (h,)
    shapes["pooler.dense.weight"] = (h, h)
    shapes["pooler.dense.bias"] = (h,)
    return shapes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minilm", type=Path, help="MiniLM model folder (for tokenizer.json)")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent.parent / "models/tiny-bert")
    args = ap.parse_args()
    src = args.minilm or minilm_dir()

    rng = np.random.default_rng(SEED)
    tensors = {}
    for name, shape in tensor_shapes(CONFIG).items():  # fixed order -> reproducible
        if name.endswith("LayerNorm.weight"):
            w = 1.0 + 0.05 * rng.standard_normal(shape)
        elif name.endswith("LayerNorm.bias"):
            w = 0.05 * rng.standard_normal(shape)
        elif name.startswith("encoder.") and name.endswith(".weight"):
            w = rng.standard_normal(shape) / np.sqrt(shape[1])  # N(0, 1/fan_in), see docstring
        else:
            w = CONFIG["initializer_range"] * rng.standard_normal(shape)
        tensors[name] = w.astype(np.float16)
    # A buffer, not a weight, but MiniLM's file carries it, so ours does too.
    tensors["embeddings.position_ids"] = np.arange(CONFIG["max_position_embeddings"], dtype=np.int64)[None, :]

    args.out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    (args.out / "config.json").write_text(json.dumps(CONFIG, indent=2) + "\n")
    shutil.copyfile(src / "tokenizer.json", args.out / "tokenizer.json")
    for f in sorted(args.out.iterdir()):
        print(f"{f}: {f.stat().st_size} bytes")


if __name__ == "__main__":
    main()
