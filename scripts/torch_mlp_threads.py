"""PyTorch side of `streampool bench --device cuda`: the same MLP (256-1024-GELU-256, fp32,
TF32 off), Python threads each on its own CUDA stream, every forward read back to the host
(as the Rust bench does with `to_vec`). Prints one table per batch size.

Usage: python3 scripts/torch_mlp_threads.py [--batch 1,32] [--threads 1,2,4,8,16] [--seconds 2]
"""

import argparse
import threading
import time

import torch


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--batch", default="1,32")
    p.add_argument("--threads", default="1,2,4,8,16")
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda:0")
    torch.manual_seed(0)
    w1 = (torch.randn(256, 1024, device=dev) / 16).contiguous()
    b1 = torch.randn(1024, device=dev)
    w2 = (torch.randn(1024, 256, device=dev) / 32).contiguous()
    b2 = torch.randn(256, device=dev)

    def forward(x):
        h = torch.nn.functional.gelu(x @ w1 + b1)
        return h @ w2 + b2

    for batch in [int(b) for b in a.batch.split(",")]:
        print(f"PyTorch {torch.__version__} MLP 256-1024-GELU-256, batch {batch}, {torch.cuda.get_device_name(0)}, {a.seconds:.1f} s per point")
        print(f"{'threads':>8} {'forwards/s':>14} {'speedup':>10}")
        base = None
        for threads in [int(t) for t in a.threads.split(",")]:
            counts = [0] * threads
            start = threading.Barrier(threads + 1)
            warm = 0.2

            def worker(i):
                stream = torch.cuda.Stream(device=dev)
                x = torch.randn(batch, 256, device=dev)
                torch.cuda.synchronize()
                start.wait()
                t0 = time.perf_counter()
                with torch.cuda.stream(stream), torch.no_grad():
                    while True:
                        now = time.perf_counter()
                        if now - t0 >= warm + a.seconds:
                            break
                        forward(x).cpu()
                        if now - t0 >= warm:
                            counts[i] += 1

            ts = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
            for t in ts:
                t.start()
            start.wait()
            for t in ts:
                t.join()
            rate = sum(counts) / a.seconds
            base = base or rate
            print(f"{threads:>8} {rate:>14.0f} {rate / base:>9.2f}x", flush=True)


if __name__ == "__main__":
    main()
