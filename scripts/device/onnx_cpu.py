#!/usr/bin/env python3
"""ONNX Runtime on the CPU, the engine TEI's and fastembed's CPU builds use: export the HF
BertModel (f32) to ONNX here with PyTorch, then time ORT (all cores) on pre-tokenized
batches, counting as `streampool bench --scenarios forward` does (forward, mean-pool and
normalize, result on the host). Writes JSON records in torch_baseline's schema.

Usage: python3 scripts/device/onnx_cpu.py MODEL_DIR OUT_DIR [seconds]
"""
import json
import os
import sys
import time

import numpy as np
import torch


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 1.5
    import onnxruntime as ort
    from transformers import AutoModel
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "minilm.onnx")
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()
    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    # A wrapper taking exactly the two inputs by keyword: the exporter passes inputs
    # positionally, and transformers 5's forward takes other arguments in those places
    # ("got multiple values for argument 'use_cache'").
    class Wrapped(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    torch.onnx.export(Wrapped(model).eval(), (ids, mask), path,
                      input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamic_axes={
                          "input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                          "last_hidden_state": {0: "b", 1: "s"}}, opset_version=17, dynamo=False)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    results = []
    for seq in (32, 128):
        for b in (1, 16, 64):
            feed = {"input_ids": np.random.randint(1000, 2000, (b, seq)).astype(np.int64),
                    "attention_mask": np.ones((b, seq), dtype=np.int64)}
            if "token_type_ids" in [i.name for i in sess.get_inputs()]:
                feed["token_type_ids"] = np.zeros((b, seq), dtype=np.int64)

            def call():
                h = sess.run(None, feed)[0]
                m = feed["attention_mask"][..., None].astype(np.float32)
                p = (h * m).sum(1) / np.maximum(m.sum(1), 1e-9)
                return p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)

            for _ in range(3):
                call()
            lat, end = [], time.perf_counter() + secs
            while time.perf_counter() < end or len(lat) < 3:
                s = time.perf_counter()
                call()
                lat.append(time.perf_counter() - s)
            lat.sort()
            rate = b * len(lat) / sum(lat)
            print(f"  onnxruntime minilm{seq} forward batch {b}: {rate:.1f} rows/s, p50 {lat[len(lat)//2]*1e3:.3f} ms", flush=True)
            results.append({"system": "onnxruntime", "device": "cpu", "workload": f"minilm{seq}",
                            "scenario": "forward", "dtype": "f32", "threads": 1, "batch": b,
                            "throughput_per_s": rate, "calls": len(lat), "seconds": sum(lat),
                            "latency_ms": {"p50": lat[len(lat) // 2] * 1e3}})
    with open(os.path.join(out, "onnxruntime.json"), "w") as f:
        json.dump({"system": "onnxruntime", "versions": {"onnxruntime": ort.__version__,
                   "torch": torch.__version__}, "results": results}, f, indent=2)
    os.remove(path)


if __name__ == "__main__":
    main()
