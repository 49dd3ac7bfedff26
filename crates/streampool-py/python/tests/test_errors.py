"""Bad input gives a Python exception with the Rust message, never a crash."""

import numpy as np
import pytest

import streampool
from conftest import TINY_BERT


def test_empty_list(tiny):
    with pytest.raises(ValueError, match="empty"):
        tiny.encode([])


@pytest.mark.parametrize("bad", [[1], ["ok", None], [b"bytes"], 5, None])
def test_non_string(tiny, bad):
    with pytest.raises(TypeError, match="str"):
        tiny.encode(bad)


def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="batch_size"):
        tiny.encode(["x"], batch_size=0)
    with pytest.raises(ValueError, match="prompt"):
        tiny.encode(["x"], prompt_name="query")
    with pytest.raises(ValueError, match="not both"):
        tiny.encode(["x"], prompt_name="query", prompt="q: ")


def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        streampool.SentenceEmbedder(tmp_path / "absent")
    # A folder without the model's files.
    with pytest.raises(FileNotFoundError):
        streampool.SentenceEmbedder(tmp_path)


def test_bad_model_file(tmp_path):
    for f in ("config.json", "tokenizer.json"):
        (tmp_path / f).write_bytes((TINY_BERT / f).read_bytes())
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="safetensors"):
        streampool.SentenceEmbedder(tmp_path)


def test_bad_device_and_dtype():
    with pytest.raises(ValueError, match="unknown device"):
        streampool.SentenceEmbedder(TINY_BERT, device="tpu")
    with pytest.raises(ValueError, match="dtype"):
        streampool.SentenceEmbedder(TINY_BERT, dtype="f8")
    if not streampool.cuda_available():
        with pytest.raises(ValueError, match="CUDA"):
            streampool.SentenceEmbedder(TINY_BERT, device="cuda")


def test_queue_bad_input(tiny):
    q = streampool.BatchQueue(tiny)
    with pytest.raises(TypeError):
        q.encode(3)
    with pytest.raises(ValueError, match="at least 1"):
        streampool.BatchQueue(tiny, workers=0)
    with pytest.raises(ValueError, match="max_wait_ms"):
        streampool.BatchQueue(tiny, max_wait_ms=-1.0)
    # The queue still works after refusing.
    assert q.encode("fine").shape == (32,)
    q.shutdown()
    with pytest.raises(RuntimeError, match="shut down"):
        q.encode("late")
    assert np.isfinite(tiny.encode("still fine")).all()
