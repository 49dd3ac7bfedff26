#!/usr/bin/env python3
"""Float64 reference outputs of the tiny checkpoints made by scripts/make_tiny_models.py,
from Hugging Face `transformers` itself (the model cast to float64 on the CPU), written to
crates/streampool-nn/tests/data/tiny_models_reference.json.

Per embedding model: the batch's token ids and mask (tokenizers, padded to the longest, pad
id and side from tokenizer_config.json), each sentence's last hidden state over its real
tokens, and its sentence embedding (each computed on the sentence alone, unpadded) with the pooling and Normalize of the model's
sentence-transformers files (computed here in float64 from the hidden states), plus the
embeddings of the same sentences with the "query" prompt prepended. Per classifier: logits
(float64) of single texts (classifier) or (query, text) pairs (reranker).

Checks the pooling semantics against sentence-transformers itself (float32): min cosine
over the sentences, stored under `validation` (must exceed 0.99999).

Usage: python3 scripts/tiny_models_reference.py [--models models] [--out FILE]
Needs: torch, transformers, sentence-transformers, tokenizers.
"""
import argparse
import hashlib
import json
from pathlib import Path

import numpy as np
import torch
import transformers as tr
from tokenizers import Tokenizer

REPO = Path(__file__).resolve().parent.parent
SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello!",
    "A stream pool lets many threads share one GPU without serializing every request.",
    "Café crème, naïve résumé, déjà vu?",
    "GPU",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "What is the capital of France? Paris is the capital of France.",
    "Numbers such as 3.14159, e-mail@example.com and unseen wörds ß.",
]
QUERY = "what is the capital of France?"
PASSAGES = [
    "Paris is the capital of France.",
    "The quick brown fox jumps over the lazy dog.",
    "Berlin is the capital of Germany, and Madrid the capital of Spain.",
    "GPU",
]
EMBEDDERS = {
    "tiny-xlmr": tr.XLMRobertaModel,
    "tiny-mpnet": tr.MPNetModel,
    "tiny-gte": tr.GteModel,
    "tiny-nomic": tr.NomicBertModel,
    "tiny-modernbert": tr.ModernBertModel,
    "tiny-qwen3": tr.Qwen3Model,
}
CLASSIFIERS = {
    "tiny-xlmr-reranker": (tr.XLMRobertaForSequenceClassification, True),
    "tiny-bert-classifier": (tr.BertForSequenceClassification, False),
}


def load_tokenizer(d: Path) -> Tokenizer:
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tc = json.loads((d / "tokenizer_config.json").read_text())
    pad = tc["pad_token"]
    tok.enable_padding(pad_id=tok.token_to_id(pad), pad_token=pad, direction=tc.get("padding_side", "right"))
    tok.enable_truncation(max_length=64)
    return tok


def batch(tok: Tokenizer, texts, pairs=None):
    enc = tok.encode_batch(list(zip(texts, pairs)) if pairs else texts)
    ids = torch.tensor([e.ids for e in enc])
    mask = torch.tensor([e.attention_mask for e in enc])
    types = torch.tensor([e.type_ids for e in enc])
    return ids, mask, types, enc


def pooling(d: Path):
    cfg = json.loads((d / "1_Pooling/config.json").read_text())
    mode = "cls" if cfg["pooling_mode_cls_token"] else "mean" if cfg["pooling_mode_mean_tokens"] else "lasttoken"
    modules = json.loads((d / "modules.json").read_text())
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    return mode, normalize


def pool(h: np.ndarray, mask: np.ndarray, mode: str, normalize: bool) -> np.ndarray:
    if mode == "cls":
        v = h[0]
    elif mode == "mean":
        v = (h * mask[:, None]).sum(0) / max(mask.sum(), 1e-9)
    else:  # the last real token: with left padding, the last row
        v = h[np.nonzero(mask)[0][-1]]
    if normalize:
        v = v / max(np.linalg.norm(v), 1e-12)
    return v


def embedder_reference(name: str, cls) -> dict:
    d = REPO / "models" / name
    model = cls.from_pretrained(d, attn_implementation="eager").double().eval()
    tok = load_tokenizer(d)
    mode, normalize = pooling(d)
    prompts = json.loads((d / "config_sentence_transformers.json").read_text())["prompts"]

    def forward(ids, mask, types):
        kwargs = dict(input_ids=ids, attention_mask=mask)
        if name not in ("tiny-qwen3", "tiny-modernbert"):
            kwargs["token_type_ids"] = types
        with torch.no_grad():
            return model(**kwargs).last_hidden_state.numpy()

    def run(texts):
        """The padded batch's ids, and each text's hidden states computed alone (unpadded:
        the reference for the real tokens of any padded batch; HF's float64 eager attention
        turns a fully masked padding row into NaN, which then leaks through 0 * NaN)."""
        ids, mask, types, _ = batch(tok, texts)
        hidden = []
        for i in range(len(texts)):
            keep = mask[i].bool()
            h = forward(ids[i][keep][None], mask[i][keep][None], types[i][keep][None])[0]
            hidden.append(h)
        return ids, mask, hidden

    ids, mask, h = run(SENTENCES)
    out = {"pooling": mode, "normalize": normalize, "batch_seq_len": ids.shape[1], "sentences": []}
    for i, text in enumerate(SENTENCES):
        ones = np.ones(len(h[i]))
        row = {
            "text": text,
            "input_ids": ids[i].tolist(),
            "attention_mask": mask[i].tolist(),
            "embedding": pool(h[i], ones, mode, normalize).tolist(),
        }
        if i < 2:  # the hidden states of two sentences (one long, one short) keep the file small
            row["last_hidden_state"] = h[i].tolist()
        out["sentences"].append(row)
    if "query" in prompts:
        prompt = prompts["query"]
        _, _, ph = run([prompt + t for t in SENTENCES])
        out["prompt_name"] = "query"
        out["prompt"] = prompt
        out["prompted_embeddings"] = [pool(x, np.ones(len(x)), mode, normalize).tolist() for x in ph]
    # sentence-transformers (float32) must agree with the pooling done here.
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(d), device="cpu")
    got = st.encode(SENTENCES, convert_to_numpy=True).astype(np.float64)
    cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
           for a, b in zip(got, (np.array(s["embedding"]) for s in out["sentences"]))]
    val = {"sentence_transformers_min_cosine": min(cos)}
    if "prompt_name" in out:
        got = st.encode(SENTENCES, prompt_name="query", convert_to_numpy=True).astype(np.float64)
        cos = [float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))
               for a, b in zip(got, (np.array(e) for e in out["prompted_embeddings"]))]
        val["sentence_transformers_prompted_min_cosine"] = min(cos)
    out["validation"] = val
    print(name, mode, "normalize" if normalize else "", val)
    return out


def classifier_reference(name: str, cls, pairs: bool) -> dict:
    d = REPO / "models" / name
    model = cls.from_pretrained(d, attn_implementation="eager").double().eval()
    tok = load_tokenizer(d)
    texts = PASSAGES if pairs else SENTENCES
    ids, mask, types, _ = batch(tok, [QUERY] * len(texts) if pairs else texts, texts if pairs else None)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, token_type_ids=types).logits.numpy()
    out = {"pairs": pairs, "texts": texts, "input_ids": ids.tolist(), "attention_mask": mask.tolist(),
           "token_type_ids": types.tolist(), "logits": logits.tolist(),
           "id2label": {str(k): v for k, v in model.config.id2label.items()}}
    if pairs:
        out["query"] = QUERY
    print(name, logits.shape)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(REPO / "crates/streampool-nn/tests/data/tiny_models_reference.json"))
    args = ap.parse_args()
    torch.manual_seed(0)
    ref = {"made_with": {"torch": torch.__version__, "transformers": tr.__version__}, "models": {}}
    for name, cls in EMBEDDERS.items():
        ref["models"][name] = embedder_reference(name, cls)
    for name, (cls, pairs) in CLASSIFIERS.items():
        ref["models"][name] = classifier_reference(name, cls, pairs)
    for name in list(EMBEDDERS) + list(CLASSIFIERS):
        st = (REPO / "models" / name / "model.safetensors").read_bytes()
        ref["models"][name]["model_sha256"] = hashlib.sha256(st).hexdigest()
    Path(args.out).write_text(json.dumps(ref, separators=(",", ":")) + "\n")
    print("wrote", args.out, Path(args.out).stat().st_size // 1024, "KiB")


if __name__ == "__main__":
    main()
