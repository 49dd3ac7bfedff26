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

from ._streampool import BatchQueue as _NativeBatchQueue
from ._streampool import SentenceEmbedder, __version__, cuda_available

__all__ = ["SentenceEmbedder", "BatchQueue", "cuda_available", "__version__"]


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
