#!/usr/bin/env python3
"""sentence-transformers' own embeddings (float32, CPU) of a real checkpoint folder, for the
check in crates/streampool-nn/tests/it/real_models.rs (cosine >= 0.99999 in f32).

Writes JSON: the folder, the model's sha256, and per sentence its text and embedding (as
`SentenceTransformer(dir).encode(...)` returns it: the folder's own pooling and Normalize);
with --prompt-name also the embeddings with that prompt.

Usage: python3 scripts/real_model_reference.py DIR OUT.json [--prompt-name NAME]
Needs: torch, sentence-transformers (scripts/requirements-reference.txt).
"""
import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

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
    "Der schnelle braune Fuchs springt über den faulen Hund.",
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("out")
    ap.add_argument("--prompt-name")
    a = ap.parse_args()
    d = Path(a.dir)
    st = SentenceTransformer(str(d), device="cpu")
    emb = st.encode(SENTENCES, convert_to_numpy=True).astype(np.float64)
    out = {
        "dir": str(d),
        "model_sha256": hashlib.sha256((d / "model.safetensors").read_bytes()).hexdigest(),
        "sentences": [{"text": t, "embedding": e.tolist()} for t, e in zip(SENTENCES, emb)],
    }
    if a.prompt_name:
        pe = st.encode(SENTENCES, prompt_name=a.prompt_name, convert_to_numpy=True).astype(np.float64)
        out["prompt_name"] = a.prompt_name
        out["prompted_embeddings"] = [e.tolist() for e in pe]
    Path(a.out).write_text(json.dumps(out) + "\n")
    print(f"wrote {a.out}: {len(SENTENCES)} sentences, dim {emb.shape[1]}")


if __name__ == "__main__":
    main()
