"""Shared fixtures: the repository's shipped models and reference data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import streampool

ROOT = Path(__file__).resolve().parents[4]
TINY_BERT = ROOT / "models" / "tiny-bert"
DATA = ROOT / "crates" / "streampool-nn" / "tests" / "data"

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "hello",
    "Streams let independent work overlap on one device.",
    "a",
    "Python threads call encode at the same time, each on its own stream.",
    "Short one.",
    "The embedding of a sentence is the mean of its token vectors, scaled to unit length.",
]


def reference(name: str) -> dict:
    with open(DATA / name) as f:
        return json.load(f)


def find_minilm() -> Path | None:
    """all-MiniLM-L6-v2 as the Rust tests find it (streampool_nn::find_minilm):
    $STREAMPOOL_MINILM_DIR, else the folder named in <cache>/minilm.path."""
    files = ("config.json", "tokenizer.json", "model.safetensors")
    env = os.environ.get("STREAMPOOL_MINILM_DIR")
    if env:
        d = Path(env)
    else:
        cache = os.environ.get("STREAMPOOL_CACHE") or (
            os.path.join(os.environ["HOME"], ".cache", "streampool") if "HOME" in os.environ else None
        )
        if not cache or not os.path.isfile(os.path.join(cache, "minilm.path")):
            return None
        d = Path(open(os.path.join(cache, "minilm.path")).read().strip())
    return d if all((d / f).is_file() for f in files) else None


@pytest.fixture(scope="session")
def tiny() -> streampool.SentenceEmbedder:
    return streampool.SentenceEmbedder(TINY_BERT)


@pytest.fixture(scope="session")
def minilm() -> streampool.SentenceEmbedder:
    d = find_minilm()
    if d is None:
        pytest.skip("all-MiniLM-L6-v2 is not installed (scripts/fetch-minilm.sh)")
    return streampool.SentenceEmbedder(str(d))
