#!/usr/bin/env python3
"""PyTorch CPU side of the issue-24 profile: F.linear GFLOP/s on MiniLM's GEMM shapes and a
torch.profiler table of the HF BertModel forward (f32, all cores), to set against
`STREAMPOOL_CPU_PROFILE=1 streampool bench --device cpu`.

Usage: python3 scripts/device/cpu_profile.py MODEL_DIR
"""
import sys
import time

import torch


def gemm_table():
    print("| M | K | N | F.linear ms | GFLOP/s |")
    print("|---:|---:|---:|---:|---:|")
    for m in (32, 128, 2048, 8192):
        for k, n in ((384, 1152), (384, 384), (384, 1536), (1536, 384)):
            x = torch.randn(m, k)
            w = torch.randn(n, k)
            b = torch.randn(n)
            with torch.inference_mode():
                for _ in range(3):
                    torch.nn.functional.linear(x, w, b)
                reps = max(3, int(2e9 / (2 * m * k * n)))
                t = []
                for _ in range(reps):
                    s = time.perf_counter()
                    torch.nn.functional.linear(x, w, b)
                    t.append(time.perf_counter() - s)
            t.sort()
            ms = t[len(t) // 2] * 1e3
            print(f"| {m} | {k} | {n} | {ms:.3f} | {2 * m * k * n / ms / 1e6:.0f} |")


def forward_profile(model_dir):
    from transformers import AutoModel, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa").eval()
    for seq, batch in ((32, 64), (128, 1), (32, 1)):
        ids = torch.randint(1000, 2000, (batch, seq))
        mask = torch.ones(batch, seq, dtype=torch.long)
        with torch.inference_mode():
            for _ in range(3):
                model(input_ids=ids, attention_mask=mask)
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    model(input_ids=ids, attention_mask=mask)
        print(f"\n## HF forward, {seq} tokens, batch {batch} (5 calls)")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14))


if __name__ == "__main__":
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    gemm_table()
    if len(sys.argv) > 1:
        forward_profile(sys.argv[1])
