"""SentenceEmbedder.encode: shapes, dtypes, and the same numbers as the Rust API."""

import numpy as np
import pytest

import streampool
from conftest import SENTENCES, TINY_BERT, reference


def test_shapes_and_dtypes(tiny):
    dim = tiny.get_sentence_embedding_dimension()
    assert dim == 32
    out = tiny.encode(SENTENCES)
    assert isinstance(out, np.ndarray)
    assert out.shape == (len(SENTENCES), dim) and out.dtype == np.float32
    assert out.flags.c_contiguous and out.flags.writeable
    one = tiny.encode("hello")
    assert one.shape == (dim,) and one.dtype == np.float32
    # Alone vs in a padded batch: equal up to float rounding.
    np.testing.assert_allclose(one, out[1], atol=2e-6, rtol=0)


def test_any_sequence_of_str(tiny):
    want = tiny.encode(SENTENCES)
    np.testing.assert_array_equal(tiny.encode(tuple(SENTENCES)), want)
    np.testing.assert_array_equal(tiny.encode(s for s in SENTENCES), want)
    np.testing.assert_array_equal(tiny.encode(np.array(SENTENCES)), want)


def test_convert_to_numpy_false_gives_rows(tiny):
    rows = tiny.encode(SENTENCES, convert_to_numpy=False, show_progress_bar=True)
    assert isinstance(rows, list) and len(rows) == len(SENTENCES)
    np.testing.assert_array_equal(np.stack(rows), tiny.encode(SENTENCES))


@pytest.mark.parametrize("batch_size", [1, 2, 3, 32])
def test_equals_rust_api(tiny, batch_size):
    # Sorted by length and batched by us, rows back in input order; padding is masked, so
    # the only difference from the Rust call (one batch) is float rounding.
    texts = SENTENCES * 5
    got = tiny.encode(texts, batch_size=batch_size)
    want = np.array(tiny._embed_rust(texts), dtype=np.float32)
    np.testing.assert_allclose(got, want, atol=2e-6, rtol=0)


def test_matches_numpy_reference(tiny):
    r = reference("tiny_bert_reference.json")
    texts = [s["text"] for s in r["sentences"]]
    want = np.array([s["embedding"] for s in r["sentences"]])
    got = tiny.encode(texts)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


def test_normalize_and_properties(tiny):
    out = tiny.encode(SENTENCES, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), 1.0, atol=1e-5)
    assert tiny.max_seq_length == 128
    assert tiny.device == "cpu" and tiny.dtype == "f32"
    assert tiny.prompts == {}
    assert "tiny-bert" in repr(tiny)


def test_prompt_is_prepended(tiny):
    np.testing.assert_array_equal(
        tiny.encode(["paris"], prompt="query: "), tiny.encode(["query: paris"])
    )


def test_dtypes_load(tiny):
    base = tiny.encode(SENTENCES)
    for dtype in ("f32", "tf32", "bf16", "f16"):
        m = streampool.SentenceEmbedder(str(TINY_BERT), device="cpu", dtype=dtype)
        assert m.dtype == dtype
        got = m.encode(SENTENCES)
        assert got.dtype == np.float32
        cos = (got * base).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(base, axis=1)
        assert cos.min() > 0.99, (dtype, cos)


def test_minilm_matches_sentence_transformers(minilm):
    r = reference("minilm_reference.json")
    texts = [s["text"] for s in r["sentences"]]
    want = np.array([s["embedding"] for s in r["sentences"]])
    got = minilm.encode(texts)
    assert got.shape == (len(texts), 384)
    assert minilm.max_seq_length == r["max_seq_length"]
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() > 0.9999
