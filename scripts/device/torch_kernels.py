#!/usr/bin/env python3
"""PyTorch's kernels for one MiniLM fp16 forward (HF BertModel, SDPA), by torch.profiler.

Prints CUDA time per kernel name (summed over 5 forwards, divided by 5), so that a kernel
profile of ours (ncu) can be set beside it. Usage: torch_kernels.py DIR BATCH SEQ
"""
import sys

import torch
from torch.profiler import ProfilerActivity, profile
from transformers import AutoModel


def main():
    d, batch, seq = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    model = AutoModel.from_pretrained(d, dtype=torch.float16, attn_implementation="sdpa").cuda().eval()
    ids = torch.full((batch, seq), 1996, dtype=torch.long, device="cuda")
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        for _ in range(5):
            model(input_ids=ids, attention_mask=mask)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                model(input_ids=ids, attention_mask=mask)
            torch.cuda.synchronize()
    rows = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            rows[e.key] = rows.get(e.key, 0.0) + e.device_time_total / 5.0
    total = sum(v for k, v in rows.items() if not k.startswith("aten::"))
    print(f"pytorch fp16 batch {batch} seq {seq}: kernel time per forward {total/1e3:.3f} ms")
    for k, v in sorted(rows.items(), key=lambda kv: -kv[1])[:25]:
        if not k.startswith("aten::"):
            print(f"  {v/1e3:8.3f} ms  {k[:110]}")


if __name__ == "__main__":
    main()
