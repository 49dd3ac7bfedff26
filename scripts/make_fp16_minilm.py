#!/usr/bin/env python3
"""Convert all-MiniLM-L6-v2 to a float16 folder small enough to carry to the GPU machine.

Why: the fp32 model.safetensors is 91 MB, over the 64 MiB a device call can carry
(scripts/device/run.sh). In float16 it is ~45 MB. Both sides of a comparison on the
device (streampool and sentence-transformers) load this file and upcast to fp32,
so they use identical weights.

Writes into OUT: model.safetensors (floating tensors as F16, same names, integer
buffers such as embeddings.position_ids kept as I64, metadata format=pt),
config.json, tokenizer.json, and the small files sentence-transformers and
transformers' tokenizer read (vocab.txt, tokenizer_config.json,
special_tokens_map.json, modules.json, sentence_bert_config.json,
config_sentence_transformers.json, 1_Pooling/config.json), so that
SentenceTransformer(OUT, model_kwargs={"dtype": torch.float32}) works there too.
Pass that dtype: transformers 5 otherwise keeps the file's fp16 (checked with 5.23);
transformers 4.x spells it torch_dtype.

Usage: python3 scripts/make_fp16_minilm.py OUT [--minilm DIR]
  DIR defaults to the path in ${STREAMPOOL_CACHE:-~/.cache/streampool}/minilm.path
  (written by scripts/fetch-minilm.sh). Needs: numpy, safetensors.
"""
import argparse
import os
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

COPY = [
    "config.json", "tokenizer.json", "vocab.txt", "tokenizer_config.json",
    "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
    "config_sentence_transformers.json", "1_Pooling/config.json",
]


def minilm_dir() -> Path:
    cache = Path(os.environ.get("STREAMPOOL_CACHE", Path.home() / ".cache/streampool"))
    path_file = cache / "minilm.path"
    if not path_file.exists():
        raise SystemExit(f"{path_file} not found: run scripts/fetch-minilm.sh first or pass --minilm")
    return Path(path_file.read_text().strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="output folder (created)")
    ap.add_argument("--minilm", type=Path, help="MiniLM model folder")
    args = ap.parse_args()
    src = args.minilm or minilm_dir()

    tensors = load_file(str(src / "model.safetensors"))
    out = {k: (v.astype(np.float16) if np.issubdtype(v.dtype, np.floating) else v) for k, v in tensors.items()}
    worst = max(float(np.abs(out[k].astype(np.float32) - v).max())
                for k, v in tensors.items() if np.issubdtype(v.dtype, np.floating))
    if not all(np.isfinite(v).all() for v in out.values() if v.dtype == np.float16):
        raise SystemExit("float16 overflow: some weight does not fit in fp16")

    args.out.mkdir(parents=True, exist_ok=True)
    save_file(out, str(args.out / "model.safetensors"), metadata={"format": "pt"})
    for name in COPY:
        dst = args.out / name
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src / name, dst)
    total = sum(f.stat().st_size for f in args.out.rglob("*") if f.is_file())
    print(f"{len(out)} tensors -> {args.out / 'model.safetensors'} "
          f"({(args.out / 'model.safetensors').stat().st_size / 1e6:.1f} MB); "
          f"max |fp16 - fp32| = {worst:.3e}; folder total {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
