"""Many Python threads (and asyncio tasks) at once: every result checked."""

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import streampool
from conftest import SENTENCES

THREADS = 64


def expected(model):
    # One text per call: the reference for each text.
    return {t: model.encode(t) for t in SENTENCES}


def test_64_threads_encode(tiny):
    want = expected(tiny)
    barrier = threading.Barrier(THREADS)

    def work(k):
        barrier.wait()  # all 64 calls start together
        for r in range(6):
            if (k + r) % 2:
                t = SENTENCES[(k + r) % len(SENTENCES)]
                np.testing.assert_allclose(tiny.encode(t), want[t], atol=2e-6, rtol=0)
            else:
                texts = [SENTENCES[(k + r + j) % len(SENTENCES)] for j in range(k % 5 + 1)]
                got = tiny.encode(texts, batch_size=2)
                assert got.shape == (len(texts), 32)
                for row, t in zip(got, texts):
                    np.testing.assert_allclose(row, want[t], atol=2e-6, rtol=0)
        return k

    with ThreadPoolExecutor(THREADS) as pool:
        assert sorted(pool.map(work, range(THREADS))) == list(range(THREADS))


def test_gil_is_released(tiny):
    # While one thread runs a long encode, this thread keeps running Python code: it could
    # not if the call held the GIL.
    texts = SENTENCES * 300
    done = threading.Event()
    result = {}

    def run():
        result["out"] = tiny.encode(texts, batch_size=16)
        done.set()

    t = threading.Thread(target=run)
    spins = 0
    t.start()
    while not done.is_set():
        spins += 1
    t.join()
    assert result["out"].shape == (len(texts), 32)
    assert spins > 1000, spins


def test_64_threads_batch_queue(tiny):
    want = expected(tiny)
    q = streampool.BatchQueue(tiny, max_batch_tokens=4096, max_batch_size=16, workers=2)
    barrier = threading.Barrier(THREADS)

    def work(k):
        barrier.wait()
        for r in range(8):
            t = SENTENCES[(k * 3 + r) % len(SENTENCES)]
            np.testing.assert_allclose(q.encode(t), want[t], atol=2e-6, rtol=0)

    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(work, range(THREADS)))
    q.shutdown()


def test_queues_of_several_priorities_share_one_device(tiny):
    # Two models on one device, one latency-critical and one bulk, called from many
    # threads at once: every answer is right whatever the class.
    from conftest import TINY_BERT

    other = streampool.SentenceEmbedder(TINY_BERT)
    want = expected(tiny)
    urgent = streampool.BatchQueue(tiny, max_batch_size=8, priority="high")
    bulk = streampool.BatchQueue(other, max_batch_size=8, priority="low", weight=3)
    assert "priority='high'" in repr(urgent) and "weight=3" in repr(bulk)

    def work(k):
        q = urgent if k % 2 else bulk
        for r in range(6):
            t = SENTENCES[(k + r) % len(SENTENCES)]
            np.testing.assert_allclose(q.encode(t), want[t], atol=2e-6, rtol=0)

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(work, range(16)))
    urgent.shutdown()
    bulk.shutdown()


def test_an_unknown_priority_is_a_value_error(tiny):
    import pytest

    with pytest.raises(ValueError, match="urgent"):
        streampool.BatchQueue(tiny, priority="urgent")
    with pytest.raises(ValueError):
        streampool.BatchQueue(tiny, weight=0)


def test_asyncio_encode_async(tiny):
    want = expected(tiny)
    q = streampool.BatchQueue(tiny, max_batch_size=8)
    texts = [SENTENCES[i % len(SENTENCES)] for i in range(256)]

    async def main():
        ticks = 0
        stop = asyncio.Event()

        async def ticker():
            # Runs between the awaits: the loop is never blocked for the whole batch.
            nonlocal ticks
            while not stop.is_set():
                ticks += 1
                await asyncio.sleep(0)

        tick = asyncio.create_task(ticker())
        results = await asyncio.gather(*(q.encode_async(t) for t in texts))
        stop.set()
        await tick
        return results, ticks

    results, ticks = asyncio.run(main())
    assert len(results) == len(texts) and ticks > 0
    for t, got in zip(texts, results):
        assert got.shape == (32,) and got.dtype == np.float32
        np.testing.assert_allclose(got, want[t], atol=2e-6, rtol=0)


def test_submit_errors_reach_the_callback(tiny):
    q = streampool.BatchQueue(tiny)
    got = []
    ev = threading.Event()

    def cb(value, error):
        got.append((value, error))
        ev.set()

    q.submit("fine", cb)
    assert ev.wait(30)
    value, error = got[0]
    assert error is None and value.shape == (32,)
    q.shutdown()
    try:
        q.submit("late", cb)
    except RuntimeError as e:
        assert "shut down" in str(e)
