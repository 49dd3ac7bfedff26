"""Ctrl-C during a long encode raises KeyboardInterrupt promptly and leaves the process usable."""

import subprocess
import sys
import textwrap

from conftest import TINY_BERT

SCRIPT = textwrap.dedent(
    f"""
    import _thread, signal, threading, time
    import streampool

    # Python maps SIGINT to KeyboardInterrupt only when its parent left SIGINT alone; a
    # shell's background job (`cmd &`, as CI runners may start the suite) ignores it, and
    # interrupt_main then does nothing: install the handler a terminal session would have.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    model = streampool.SentenceEmbedder({str(TINY_BERT)!r})
    texts = ["a sentence long enough to take some time to embed, word " * 8] * 200_000
    threading.Timer(0.5, _thread.interrupt_main).start()
    start = time.perf_counter()
    try:
        model.encode(texts, batch_size=32)
        print("not interrupted")
    except KeyboardInterrupt:
        print("interrupted after", round(time.perf_counter() - start, 2), "s")
    # Still usable, from this thread and others.
    assert model.encode("after").shape == (32,)
    t = threading.Thread(target=lambda: model.encode(["x", "y"]))
    t.start(); t.join()
    print("ok")
    """
)


def test_keyboard_interrupt_does_not_wedge():
    # 200k long sentences take minutes; the interrupt must end the call within seconds.
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert lines[0].startswith("interrupted after"), p.stdout
    assert "ok" in lines, p.stdout
