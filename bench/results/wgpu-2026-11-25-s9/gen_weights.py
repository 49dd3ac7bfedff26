"""Writes DIR/model.safetensors with the header of MiniLM's fp16 file (carried: the weights are
over the device call's carry limit) and random values: same names, shapes and dtypes, so the
same kernels at the same shapes; timings do not depend on the values. Usage: gen_weights.py HEADER DIR"""
import json, struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
rng = np.random.default_rng(0)
end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
data = bytearray(end)
for k, v in h.items():
    if k == "__metadata__":
        continue
    a, b = v["data_offsets"]
    shape = v["shape"]
    if v["dtype"] == "I64":
        x = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    elif k.endswith("LayerNorm.weight"):
        x = np.ones(shape, np.float16)
    elif k.endswith("bias"):
        x = np.zeros(shape, np.float16)
    else:
        x = (rng.standard_normal(shape) * 0.05).astype(np.float16)
    assert x.nbytes == b - a, k
    data[a:b] = x.tobytes()
open(sys.argv[2] + "/model.safetensors", "wb").write(raw[:8 + n] + bytes(data))
