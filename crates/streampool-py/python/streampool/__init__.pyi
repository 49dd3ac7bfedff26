"""Type stubs and docstrings of the streampool package (native module: streampool._streampool)."""

import os
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple, Union, overload

import numpy as np
import numpy.typing as npt

__version__: str

def cuda_available() -> bool:
    """Whether this build has the CUDA backend (``device="cuda"``); wheels built with
    ``maturin build --features cuda`` have it."""

class SentenceEmbedder:
    """A sentence-embedding model (BERT, MiniLM, XLM-R, MPNet, GTE, NomicBERT, Qwen3 families)
    on one device; sentence-transformers' ``SentenceTransformer`` where the two overlap.

    Every call releases the GIL for all of its work, so N Python threads encoding at once
    run in parallel, each on its own stream of the device. One object serves any number of
    threads.

    Args:
        model_name_or_path: a local folder with ``config.json``, ``tokenizer.json`` and
            ``model.safetensors`` (and, where the model has them, sentence-transformers'
            ``modules.json``, pooling config and ``sentence_bert_config.json``). Nothing is
            downloaded: a missing folder raises ``FileNotFoundError``.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"f32"``, ``"tf32"``, ``"f16"`` or ``"bf16"`` for weights and activations
            (embeddings are float32 whatever it is). Default: f16 on CUDA, f32 on the CPU.

    Raises:
        FileNotFoundError: no such folder, or a model file is missing.
        ValueError: bad model files, an unknown device or dtype, CUDA in a CPU-only build.
        RuntimeError: the device failed.

    >>> model = SentenceEmbedder("models/tiny-bert")
    >>> model.encode(["a sentence", "another"]).shape
    (2, 32)
    """

    def __init__(
        self,
        model_name_or_path: Union[str, os.PathLike],
        device: str = "cpu",
        dtype: Optional[str] = None,
    ) -> None: ...
    @overload
    def encode(
        self,
        sentences: str,
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        convert_to_numpy: bool = True,
        show_progress_bar: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
    ) -> npt.NDArray[np.float32]: ...
    @overload
    def encode(
        self,
        sentences: Iterable[str],
        batch_size: int = 32,
        normalize_embeddings: bool = False,
        convert_to_numpy: bool = True,
        show_progress_bar: bool = False,
        prompt_name: Optional[str] = None,
        prompt: Optional[str] = None,
    ) -> Union[npt.NDArray[np.float32], List[npt.NDArray[np.float32]]]:
        """Embeds sentences: float32 ``[n, dim]`` for a sequence, ``[dim]`` for one str.

        Texts are sorted by length and run ``batch_size`` at a time (as
        sentence-transformers does); each row is written straight into the returned array
        at its sentence's position. The GIL is released for the whole call; Ctrl-C is
        honoured between batches.

        Args:
            sentences: one str, or a list (any iterable) of str.
            batch_size: texts per forward.
            normalize_embeddings: scale to unit length (models whose pooling normalizes,
                like all-MiniLM-L6-v2, already are).
            convert_to_numpy: ``False`` gives a list of per-sentence float32 arrays.
            show_progress_bar: accepted for compatibility; no bar is drawn.
            prompt_name: one of the model's ``prompts``, prepended to every text.
            prompt: a prompt string to prepend (not together with ``prompt_name``).

        Raises:
            TypeError: ``sentences`` is not a str or an iterable of str.
            ValueError: an empty list, ``batch_size`` 0, an unknown prompt name.
            MemoryError: the device ran out of memory.
            RuntimeError: non-finite embeddings (f16 overflow) or a device failure.
        """
    def get_sentence_embedding_dimension(self) -> int:
        """The embedding width (384 for all-MiniLM-L6-v2)."""
    @property
    def max_seq_length(self) -> int:
        """Most tokens per text, special tokens included; longer texts are truncated."""
    @property
    def device(self) -> str:
        """``"cpu"`` or ``"cuda:N"``."""
    @property
    def dtype(self) -> str:
        """The compute dtype: ``"f32"``, ``"tf32"``, ``"f16"`` or ``"bf16"``."""
    @property
    def prompts(self) -> Dict[str, str]:
        """The model's named prompts (``config_sentence_transformers.json``)."""
    def _embed_rust(self, texts: List[str]) -> List[List[float]]:
        """The Rust API's answer (``SentenceEmbedder::embed``), for tests."""
    def _time_rust(self, text: str, iters: int) -> float:
        """Seconds per Rust-direct ``embed([text])`` call, timed in Rust, for benchmarks."""

class CrossEncoder:
    """A reranker or sequence classifier (a ``*ForSequenceClassification`` checkpoint), as
    sentence-transformers' ``CrossEncoder``: texts and ``(text, text_pair)`` pairs in, scores
    out. The model runs in Rust with the GIL released; inputs longer than the model's limit
    are truncated (a pair longest first).

    Args:
        model_name_or_path: a local folder (``config.json``, ``tokenizer.json``,
            ``model.safetensors``); models are not downloaded.
        device: ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        dtype: ``"f32"``, ``"f16"``, ``"bf16"`` (default: f16 on CUDA, f32 on the CPU).

    Raises:
        FileNotFoundError: no such folder, or a model file is missing.
        ValueError: not a sequence-classification checkpoint, an unknown device or dtype.

    >>> model = CrossEncoder("models/tiny-xlmr-reranker")
    >>> model.predict([("what is a GPU?", "A graphics processor."), ("what is a GPU?", "Bread.")]).shape
    (2,)
    >>> model.rank("what is a GPU?", ["Bread.", "A graphics processor."], top_k=1)[0]["corpus_id"]  # doctest: +SKIP
    1
    """

    def __init__(
        self, model_name_or_path: str, device: str = "cpu", dtype: Optional[str] = None
    ) -> None: ...
    def predict(
        self,
        sentences: Union[Tuple[str, str], Sequence[Union[str, Tuple[str, str]]]],
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        activation_fn: Optional[Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]] = None,
        apply_softmax: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> Union[np.float32, npt.NDArray[np.float32]]:
        """Scores: ``[n]`` for a reranker (the sigmoid of each logit), ``[n, labels]`` logits
        for a classifier (probabilities with ``apply_softmax``); one pair gives one score
        (row). ``activation_fn`` replaces the default activation. Raises ``TypeError`` for an
        input that is not a str or a pair of str, ``ValueError`` for an empty list."""
    def rank(
        self,
        query: str,
        documents: Sequence[str],
        top_k: Optional[int] = None,
        return_documents: bool = False,
        batch_size: int = 32,
        show_progress_bar: Optional[bool] = None,
        activation_fn: Optional[Callable[[npt.NDArray[np.float32]], npt.NDArray[np.float32]]] = None,
        apply_softmax: bool = False,
        convert_to_numpy: bool = True,
        convert_to_tensor: bool = False,
    ) -> List[Dict[str, Union[int, float, str]]]:
        """``documents`` ranked against ``query``, best first: ``{"corpus_id", "score"}``
        (and ``"text"`` with ``return_documents``), the first ``top_k``."""
    @property
    def num_labels(self) -> int:
        """Labels of the model's head (1 for a reranker)."""
    @property
    def labels(self) -> List[str]:
        """The label names, by class index."""
    @property
    def max_length(self) -> int:
        """The longest input in tokens; longer ones are truncated."""
    @property
    def device(self) -> str: ...
    @property
    def dtype(self) -> str: ...
    def _logits(self, sentences: Sequence[Union[str, Tuple[str, str]]], batch_size: int = 32) -> npt.NDArray[np.float32]:
        """The raw logits ``[n, labels]``, for tests."""

class BatchQueue:
    """Dynamic batching over a ``SentenceEmbedder``: single texts from many threads or
    asyncio tasks are joined into batches of up to ``max_batch_size`` texts and
    ``max_batch_tokens`` tokens (rows x longest text), run by ``workers`` threads, each on
    its own device stream.

    Args:
        model: the embedder to run.
        max_batch_tokens: most tokens per batch.
        max_batch_size: most texts per batch.
        workers: worker threads (streams).
        max_queue: most requests waiting; beyond it ``encode`` raises ``RuntimeError``
            (queue full, with an estimated retry time).
        max_wait_ms: how long a worker holding a partial batch waits for more (0: runs
            what is queued at once).
        normalize_embeddings: scale results to unit length.
        priority: this queue's class on its device, shared with every other queue there:
            ``"high"`` (latency-critical: its batches never wait for other queues' and run
            on the device's high-priority streams), ``"normal"``, or ``"low"`` (bulk work:
            runs when no normal batch waits). A ``ValueError`` for anything else.
        weight: its share of the device within its class (>= 1): saturating queues of one
            class get the device's tokens in proportion to their weights.

    >>> queue = BatchQueue(SentenceEmbedder("models/tiny-bert"), max_batch_tokens=4096)
    >>> queue.encode("one text").shape
    (32,)
    """

    def __init__(
        self,
        model: SentenceEmbedder,
        max_batch_tokens: int = 16384,
        max_batch_size: int = 32,
        workers: int = 2,
        max_queue: int = 1024,
        max_wait_ms: float = 0.0,
        normalize_embeddings: bool = False,
        priority: str = "normal",
        weight: int = 1,
    ) -> None: ...
    def encode(self, text: str) -> npt.NDArray[np.float32]:
        """The embedding of ``text`` (float32 ``[dim]``); blocks this thread, not the GIL."""
    async def encode_async(self, text: str) -> npt.NDArray[np.float32]:
        """The embedding of ``text``, awaited without blocking the event loop."""
    def submit(
        self,
        text: str,
        callback: Callable[[Optional[npt.NDArray[np.float32]], Optional[BaseException]], None],
    ) -> None:
        """Queues ``text``; ``callback(embedding, None)`` or ``callback(None, error)`` runs
        later on the queue's completion thread."""
    @property
    def queue_len(self) -> int:
        """Requests waiting."""
    def shutdown(self) -> None:
        """Stops accepting requests; waits for the queued ones to be answered."""
