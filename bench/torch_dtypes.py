#!/usr/bin/env python3
"""PyTorch's MiniLM throughput per dtype: the baseline of issue #10, in one script.

For each dtype (fp32, tf32, fp16, bf16), sequence length (32, 128) and batch (64, 512): the
Hugging Face BertModel forward on pre-tokenized inputs with SDPA attention, plus mean pooling
and L2 normalization (what a skilled user runs for embeddings), timed with CUDA events after
a warm-up, median of repeats. Then sentence-transformers `encode` end to end (tokenization
included) in fp16 at batch 512. Sentences are the same formula as `bench/torch_baseline.py`
and `streampool bench`. Writes `torch_dtypes.json` into --out and prints a table.

Usage: python3 bench/torch_dtypes.py --minilm DIR [--out DIR]
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import sentence  # noqa: E402  (same sentences as the main baseline)


def forward_rate(model, ids, mask, reps=20):
    def run():
        out = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask.unsqueeze(-1).to(out.dtype)
        pooled = (out * m).sum(1) / m.sum(1)
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    with torch.inference_mode():
        for _ in range(3):
            run()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
    t = statistics.median(times)
    return ids.shape[0] / t, t


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--minilm", required=True)
    p.add_argument("--out", default="bench/results/latest")
    a = p.parse_args()
    os.makedirs(a.out, exist_ok=True)
    from transformers import AutoModel, AutoTokenizer
    from sentence_transformers import SentenceTransformer

    tok = AutoTokenizer.from_pretrained(a.minilm)
    rows = []
    for name, dtype, tf32 in [("fp32", torch.float32, False), ("tf32", torch.float32, True),
                              ("fp16", torch.float16, False), ("bf16", torch.bfloat16, False)]:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.backends.cudnn.allow_tf32 = tf32
        model = AutoModel.from_pretrained(a.minilm, dtype=dtype, attn_implementation="sdpa").cuda().eval()
        for seq in (32, 128):
            for batch in (64, 512):
                texts = [sentence(i, seq) for i in range(batch)]
                enc = tok(texts, padding=True, truncation=True, max_length=seq, return_tensors="pt")
                ids, mask = enc["input_ids"].cuda(), enc["attention_mask"].cuda()
                rate, t = forward_rate(model, ids, mask)
                rows.append({"system": "pytorch", "what": "forward", "dtype": name, "seq": seq,
                             "batch": batch, "tokens": int(ids.shape[1]),
                             "sentences_per_s": rate, "batch_ms": t * 1e3})
                print(f"pytorch forward {name:5} seq {seq:3} batch {batch:3}: {rate:10.0f} sentences/s ({t*1e3:.2f} ms)", flush=True)
        del model
        torch.cuda.empty_cache()
    torch.backends.cuda.matmul.allow_tf32 = False
    st = SentenceTransformer(a.minilm, device="cuda", model_kwargs={"dtype": torch.float16})
    for seq in (32, 128):
        texts = [sentence(i, seq) for i in range(512)]
        st.encode(texts, batch_size=512)
        torch.cuda.synchronize()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            st.encode(texts, batch_size=512, convert_to_numpy=True)
            ts.append(time.perf_counter() - t0)
        t = statistics.median(ts)
        rows.append({"system": "sentence-transformers", "what": "encode", "dtype": "fp16", "seq": seq,
                     "batch": 512, "sentences_per_s": 512 / t, "batch_ms": t * 1e3})
        print(f"sentence-transformers encode fp16 seq {seq:3} batch 512: {512/t:10.0f} sentences/s", flush=True)
    with open(os.path.join(a.out, "torch_dtypes.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
