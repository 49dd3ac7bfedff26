"""streampool.CrossEncoder against the transformers references of the tiny checkpoints.

sentence-transformers' ``CrossEncoder.predict`` is the sigmoid of the model's logit for one
label and the logits themselves for several, so matching the committed transformers logits
(``tiny_models_reference.json``) is matching it.
"""

from __future__ import annotations

import numpy as np
import pytest

import streampool

from conftest import ROOT, reference

MODELS = ROOT / "models"


@pytest.fixture(scope="module")
def refs():
    return reference("tiny_models_reference.json")["models"]


def test_predict_matches_the_reranker_reference(refs):
    r = refs["tiny-xlmr-reranker"]
    model = streampool.CrossEncoder(str(MODELS / "tiny-xlmr-reranker"))
    assert model.num_labels == 1
    pairs = [(r["query"], t) for t in r["texts"]]
    want = 1.0 / (1.0 + np.exp(-np.array(r["logits"])[:, 0]))
    got = model.predict(pairs, batch_size=3)
    assert got.shape == (len(pairs),) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, atol=1e-5)
    # One pair gives one score; a custom activation replaces the sigmoid.
    assert np.isclose(model.predict(pairs[0]), want[0], atol=1e-5)
    raw = model.predict(pairs, activation_fn=lambda x: x)
    np.testing.assert_allclose(raw, np.array(r["logits"])[:, 0], atol=1e-4)


def test_rank_orders_documents_best_first(refs):
    r = refs["tiny-xlmr-reranker"]
    model = streampool.CrossEncoder(str(MODELS / "tiny-xlmr-reranker"))
    ranked = model.rank(r["query"], r["texts"], return_documents=True)
    logits = np.array(r["logits"])[:, 0]
    assert [x["corpus_id"] for x in ranked] == list(np.argsort(-logits, kind="stable"))
    assert all(x["text"] == r["texts"][x["corpus_id"]] for x in ranked)
    scores = [x["score"] for x in ranked]
    assert scores == sorted(scores, reverse=True)
    assert len(model.rank(r["query"], r["texts"], top_k=2)) == 2
    assert "text" not in model.rank(r["query"], r["texts"])[0]


def test_a_classifier_gives_logits_or_probabilities(refs):
    c = refs["tiny-bert-classifier"]
    model = streampool.CrossEncoder(str(MODELS / "tiny-bert-classifier"))
    assert model.num_labels == len(c["id2label"])
    # The reference classifies single texts: the raw logits of each.
    want = np.array(c["logits"])
    np.testing.assert_allclose(model._logits(c["texts"], 3), want, atol=1e-4)
    # Pairs: logits [n, labels] (no activation for several labels), or probabilities.
    pairs = [(a, b) for a, b in zip(c["texts"], reversed(c["texts"]))]
    logits = model._logits(pairs)
    np.testing.assert_allclose(model.predict(pairs), logits, atol=1e-6)
    probs = model.predict(pairs, apply_softmax=True)
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(axis=1, keepdims=True), atol=1e-5)
    with pytest.raises(ValueError, match="reranker"):
        model.rank("q", ["a", "b"])


def test_bad_inputs_raise_clear_errors():
    model = streampool.CrossEncoder(str(MODELS / "tiny-xlmr-reranker"))
    with pytest.raises(TypeError, match="pair of str"):
        model.predict([("a", 1)])
    with pytest.raises(ValueError, match="empty"):
        model.predict([])
    with pytest.raises(ValueError, match="batch_size"):
        model.predict([("a", "b")], batch_size=0)
    with pytest.raises(FileNotFoundError):
        streampool.CrossEncoder(str(MODELS / "no-such-model"))
