#!/usr/bin/env python3
"""Clients no one here wrote against a running `streampool serve`.

Drives the server with NVIDIA's `tritonclient[http]` (KServe v2: health, metadata,
readiness, infer with JSON and with binary tensors), with OpenAI's `openai` package
(`client.embeddings.create`, `client.models`), and, when installed, with Hugging Face's
`huggingface_hub` (`InferenceClient.feature_extraction`, the client of text-embeddings-
inference's `/embed`), and checks every answer against the expected values the Rust test
computed with the in-process models (a JSON file).

Usage: test_clients.py --url 127.0.0.1:PORT --expected expected.json
Exits non-zero on the first mismatch.
"""

import argparse
import json
import sys

import numpy as np
import openai
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

TOL = 1e-5


def close(got, want, what):
    got = np.asarray(got, dtype=np.float32)
    want = np.asarray(want, dtype=np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    err = np.abs(got - want) / np.maximum(1.0, np.maximum(np.abs(got), np.abs(want)))
    assert err.max(initial=0.0) <= TOL, f"{what}: max error {err.max()}"


def check_triton(url, exp):
    client = httpclient.InferenceServerClient(url=url)
    assert client.is_server_live(), "server not live"
    assert client.is_server_ready(), "server not ready"
    emb, mlp = exp["embedder"], exp["mlp"]
    for name in (emb["name"], mlp["name"]):
        assert client.is_model_ready(name), f"{name} not ready"
    meta = client.get_model_metadata(emb["name"])
    assert meta["name"] == emb["name"], meta
    assert meta["outputs"][0]["shape"] == [-1, emb["dim"]], meta
    assert not client.is_model_ready("no-such-model")

    texts = emb["texts"]
    want = np.array(emb["vectors"], dtype=np.float32)
    for binary in (True, False):
        inp = httpclient.InferInput("text", [len(texts)], "BYTES")
        inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=np.object_), binary_data=binary)
        out = httpclient.InferRequestedOutput("embedding", binary_data=binary)
        res = client.infer(emb["name"], [inp], outputs=[out])
        close(res.as_numpy("embedding"), want, f"triton embedder binary={binary}")
    # No outputs named: the client asks for binary outputs of everything.
    inp = httpclient.InferInput("text", [len(texts), 1], "BYTES")
    inp.set_data_from_numpy(np.array([[t] for t in texts], dtype=np.object_))
    close(client.infer(emb["name"], [inp]).as_numpy("embedding"), want, "triton embedder [N,1]")

    x = np.array(mlp["inputs"], dtype=np.float32)
    for binary in (True, False):
        inp = httpclient.InferInput("input", list(x.shape), "FP32")
        inp.set_data_from_numpy(x, binary_data=binary)
        out = httpclient.InferRequestedOutput("output", binary_data=binary)
        res = client.infer(mlp["name"], [inp], outputs=[out])
        close(res.as_numpy("output"), mlp["outputs"], f"triton mlp binary={binary}")

    # Errors reach the client as exceptions with the server's message.
    bad = httpclient.InferInput("input", [1, 3], "FP32")
    bad.set_data_from_numpy(np.zeros((1, 3), dtype=np.float32))
    try:
        client.infer(mlp["name"], [bad])
        raise AssertionError("a wrong shape was accepted")
    except InferenceServerException as e:
        assert "shape" in str(e), e
    try:
        client.infer("no-such-model", [bad])
        raise AssertionError("an unknown model was accepted")
    except InferenceServerException as e:
        assert "unknown model" in str(e), e
    client.close()
    print("tritonclient: ok")


def check_openai(url, exp):
    emb = exp["embedder"]
    client = openai.OpenAI(base_url=f"http://{url}/v1", api_key="unused", max_retries=0)
    texts = emb["texts"]
    # The client's default encoding is base64; also ask for floats.
    for fmt in (openai.NOT_GIVEN, "float"):
        res = client.embeddings.create(model=emb["name"], input=texts, encoding_format=fmt)
        assert res.model == emb["name"], res.model
        assert [d.index for d in res.data] == list(range(len(texts)))
        close([d.embedding for d in res.data], emb["vectors"], f"openai list {fmt}")
        assert res.usage.prompt_tokens == sum(emb["tokens"]), res.usage
        assert res.usage.total_tokens == sum(emb["tokens"]), res.usage
    res = client.embeddings.create(model=emb["name"], input=texts[0])
    assert len(res.data) == 1
    close(res.data[0].embedding, emb["vectors"][0], "openai single")
    assert res.usage.prompt_tokens == emb["tokens"][0], res.usage
    try:
        client.embeddings.create(model="no-such-model", input="x")
        raise AssertionError("an unknown model was accepted")
    except openai.NotFoundError as e:
        assert "unknown model" in str(e), e
    try:
        client.embeddings.create(model=emb["name"], input=["x"] * (exp["max_inputs"] + 1))
        raise AssertionError("too many inputs were accepted")
    except openai.APIStatusError as e:
        assert e.status_code == 413 and "exceed" in str(e), e
    assert sorted(m.id for m in client.models.list()) == sorted([emb["name"], exp["mlp"]["name"]])
    assert client.models.retrieve(emb["name"]).id == emb["name"]
    try:
        client.models.retrieve("no-such-model")
        raise AssertionError("an unknown model was found")
    except openai.NotFoundError:
        pass
    print("openai: ok")


def check_huggingface_hub(url, exp):
    try:
        from huggingface_hub import InferenceClient
    except ImportError:
        print("!!!!!!!!!! huggingface_hub: SKIPPED (not installed; CI installs it) !!!!!!!!!!")
        return
    emb = exp["embedder"]
    # The TEI way: the server's URL as the model; the client posts TEI's request to it.
    client = InferenceClient(model=f"http://{url}")
    texts = emb["texts"]
    close(client.feature_extraction(texts[0]), [emb["vectors"][0]], "huggingface_hub single")
    close(client.feature_extraction(texts), emb["vectors"], "huggingface_hub list")
    raw = client.feature_extraction(texts[0], normalize=False)
    norm = np.linalg.norm(raw[0])
    close(raw[0] / norm, emb["vectors"][0], "huggingface_hub normalize=False")
    print("huggingface_hub: ok")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--expected", required=True)
    args = ap.parse_args()
    with open(args.expected) as f:
        exp = json.load(f)
    check_triton(args.url, exp)
    check_openai(args.url, exp)
    check_huggingface_hub(args.url, exp)
    print("all client checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
