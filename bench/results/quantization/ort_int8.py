#!/usr/bin/env python3
"""The ONNX Runtime anchor for the CPU int8 figures: the HF model exported to ONNX (f32),
and its `quantize_dynamic` (int8 weights per channel, activations quantized per call), both
timed on pre-tokenized batches of random ids, counting as `int8_speed` does (forward,
mean-pool and normalize on the host, every core). Prints one line per point and writes
JSON.

Usage: python3 ort_int8.py MODEL_DIR OUT_DIR [seconds]
"""
import json
import os
import sys
import time

import numpy as np
import torch


def main():
    model_dir, out = sys.argv[1], sys.argv[2]
    secs = float(sys.argv[3]) if len(sys.argv) > 3 else 2.0
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModel

    os.makedirs(out, exist_ok=True)
    f32_path = os.path.join(out, "model.onnx")
    int8_path = os.path.join(out, "model.int8.onnx")
    model = AutoModel.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager").eval()

    class Wrapped(torch.nn.Module):
        # Exactly the two inputs, by keyword (the exporter passes inputs positionally).
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask):
            return self.m(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    ids = torch.randint(1000, 2000, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    torch.onnx.export(Wrapped(model).eval(), (ids, mask), f32_path,
                      input_names=["input_ids", "attention_mask"],
                      output_names=["last_hidden_state"], dynamic_axes={
                          "input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"},
                          "last_hidden_state": {0: "b", 1: "s"}}, opset_version=17, dynamo=False)
    quantize_dynamic(f32_path, int8_path, weight_type=QuantType.QInt8, per_channel=True)
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sessions = {name: ort.InferenceSession(p, so, providers=["CPUExecutionProvider"])
                for name, p in (("f32", f32_path), ("int8", int8_path))}
    results = []
    rng = np.random.default_rng(0)
    for seq in (32, 128):
        for b in (1, 64):
            ids = rng.integers(1000, 21000, (b, seq)).astype(np.int64)
            ids[:, 0], ids[:, -1] = 101, 102
            feed = {"input_ids": ids, "attention_mask": np.ones((b, seq), dtype=np.int64)}
            rates = {}
            for name, sess in sessions.items():
                def call():
                    h = sess.run(None, feed)[0]
                    p = h.mean(1)
                    return p / np.maximum(np.linalg.norm(p, axis=1, keepdims=True), 1e-12)

                for _ in range(3):
                    call()
                lat, end = [], time.perf_counter() + secs
                while time.perf_counter() < end or len(lat) < 5:
                    s = time.perf_counter()
                    call()
                    lat.append(time.perf_counter() - s)
                lat.sort()
                p50 = lat[len(lat) // 2]
                rates[name] = b / p50
                results.append({"system": "onnxruntime", "dtype": name, "tokens": seq, "batch": b,
                                "rows_per_s_p50": b / p50, "p50_ms": p50 * 1e3, "calls": len(lat)})
            print(f"onnxruntime {seq} tokens batch {b}: f32 {rates['f32']:.1f} rows/s, "
                  f"int8 {rates['int8']:.1f} rows/s ({rates['int8'] / rates['f32']:.2f}x)", flush=True)
    with open(os.path.join(out, "onnxruntime.json"), "w") as f:
        json.dump({"versions": {"onnxruntime": ort.__version__, "torch": torch.__version__},
                   "threads": os.cpu_count(), "results": results}, f, indent=1)
    for p in (f32_path, int8_path):
        os.remove(p)


if __name__ == "__main__":
    main()
