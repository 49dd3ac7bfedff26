"""streampool: sentence embeddings from Rust, with the GIL released.

``SentenceEmbedder`` has sentence-transformers' ``encode``; ``BatchQueue`` batches single
texts from many threads or asyncio tasks into one forward. See ``__init__.pyi`` for the
full signatures and docstrings.

>>> import streampool
>>> model = streampool.SentenceEmbedder("models/tiny-bert")  # doctest: +SKIP
>>> model.encode(["a sentence", "another"]).shape              # doctest: +SKIP
(2, 32)
"""

from __future__ import annotations

import asyncio

import numpy as np

from ._streampool import BatchQueue as _NativeBatchQueue
from ._streampool import CrossEncoder as _NativeCrossEncoder
from ._streampool import SentenceEmbedder, __version__, cuda_available

__all__ = ["SentenceEmbedder", "CrossEncoder", "BatchQueue", "cuda_available", "__version__"]


def _settle(fut: asyncio.Future, value, error) -> None:
    # Runs on the event loop's thread; a task cancelled meanwhile has a done future.
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(value)


class BatchQueue(_NativeBatchQueue):
    """Batches single texts from many Python threads or asyncio tasks into shared forwards.

    ``queue.encode(text)`` blocks its thread (without the GIL) until the batch holding the
    text has run; ``await queue.encode_async(text)`` waits without blocking the event loop.
    Both return a float32 array ``[dim]``.
    """

    async def encode_async(self, text: str):
        """The embedding of ``text`` (float32 ``[dim]``), awaited without blocking the loop."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()

        def done(value, error):
            # Called on the queue's completion thread: hand the answer to the loop's thread.
            try:
                loop.call_soon_threadsafe(_settle, fut, value, error)
            except RuntimeError:
                pass  # the loop was closed; nobody awaits the answer any more

        self.submit(text, done)
        return await fut


class CrossEncoder(_NativeCrossEncoder):
    """Scores texts and ``(text, text_pair)`` pairs: sentence-transformers' ``CrossEncoder``.

    A reranker (one label) scores a (query, document) pair with the sigmoid of its logit; a
    classifier of several labels gives its logits (``apply_softmax=True``: probabilities).
    The model runs in Rust with the GIL released.
    """

    def predict(
        self,
        sentences,
        batch_size: int = 32,
        show_progress_bar=None,
        activation_fn=None,
        apply_softmax: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ):
        """Scores of ``sentences`` (pairs, or one pair): ``[n]`` for one label, else ``[n, labels]``.

        ``activation_fn`` (a callable on the float32 logits array) replaces the default
        (sigmoid for one label, none otherwise); ``apply_softmax`` then turns several labels'
        scores into probabilities. ``show_progress_bar`` is accepted for compatibility and
        draws nothing; ``convert_to_tensor`` is refused (no torch here).
        """
        del show_progress_bar, convert_to_numpy
        if convert_to_tensor:
            raise ValueError("convert_to_tensor is not supported: streampool returns NumPy arrays")
        # One text or one pair gives one score (row), as in sentence-transformers.
        single = isinstance(sentences, str) or (
            isinstance(sentences, (tuple, list)) and len(sentences) > 0 and isinstance(sentences[0], str)
        )
        if single:
            sentences = [sentences]
        else:
            sentences = list(sentences)
        if not sentences:
            raise ValueError("sentences is empty: give at least one pair")
        scores = self._logits(sentences, batch_size)
        if activation_fn is not None:
            scores = np.asarray(activation_fn(scores), dtype=np.float32)
        elif self.num_labels == 1:
            scores = 1.0 / (1.0 + np.exp(-scores))
        if apply_softmax and scores.ndim == 2 and scores.shape[1] > 1:
            e = np.exp(scores - scores.max(axis=1, keepdims=True))
            scores = e / e.sum(axis=1, keepdims=True)
        if scores.ndim == 2 and scores.shape[1] == 1:
            scores = scores[:, 0]
        scores = scores.astype(np.float32, copy=False)
        return scores[0] if single else scores

    def rank(
        self,
        query: str,
        documents,
        top_k=None,
        return_documents: bool = False,
        batch_size: int = 32,
        show_progress_bar=None,
        activation_fn=None,
        apply_softmax: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ):
        """``documents`` ranked against ``query``, best first: a list of
        ``{"corpus_id", "score"[, "text"]}``, the first ``top_k`` (default all)."""
        documents = list(documents)
        if not documents:
            raise ValueError("documents is empty: give at least one document")
        if self.num_labels != 1:
            raise ValueError(f"rank needs a reranker (one label); this model has {self.num_labels}")
        scores = self.predict(
            [(query, d) for d in documents],
            batch_size=batch_size,
            activation_fn=activation_fn,
            apply_softmax=apply_softmax,
            convert_to_tensor=convert_to_tensor,
        )
        order = sorted(range(len(documents)), key=lambda i: -float(scores[i]))
        if top_k is not None:
            order = order[:top_k]
        results = []
        for i in order:
            r = {"corpus_id": i, "score": float(scores[i])}
            if return_documents:
                r["text"] = documents[i]
            results.append(r)
        return results
