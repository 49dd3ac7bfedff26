#!/usr/bin/env python3
"""Compare the PTX of two versions of `kernels.cu`, kernel by kernel, without a GPU.

A refactor of the CUDA kernels (a template replacing two copies, say) that leaves every
kernel's PTX the same needs no device time to show it changed nothing: same PTX, same code,
same speed. NVRTC comes from the `nvidia-cuda-nvrtc` wheel (PyPI), which runs here without a
GPU or a CUDA install:

    pip download --no-deps -d /tmp/nvrtc nvidia-cuda-nvrtc && (cd /tmp/nvrtc && unzip -oq *.whl)
    git show HEAD:crates/streampool/src/cuda/kernels.cu > /tmp/before.cu
    python3 scripts/cuda_ptx_diff.py /tmp/before.cu crates/streampool/src/cuda/kernels.cu \
        --nvrtc /tmp/nvrtc/nvidia/cu13/lib/libnvrtc.so.13 [--match layer_norm]

Prints one line per kernel (same / DIFFERENT / only in one) for compute_90 (the H100), with
local labels normalized; exits 1 if any matched kernel differs.
"""
import argparse
import ctypes
import re
import sys


def ptx(lib, path, arch):
    src = open(path, "rb").read()
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src, b"kernels.cu", 0, None, None) != 0:
        sys.exit(f"nvrtcCreateProgram failed for {path}")
    opts = [f"--gpu-architecture={arch}".encode()]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    if rc != 0:
        n = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
        log = ctypes.create_string_buffer(n.value)
        lib.nvrtcGetProgramLog(prog, log)
        sys.exit(f"{path} does not compile:\n{log.value.decode()}")
    n = ctypes.c_size_t()
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    buf = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, buf)
    return buf.value.decode()


def entries(text, pattern):
    out = {}
    for m in re.finditer(r"\.entry (\w+)\((.*?)\n}\n", text, re.S):
        if re.search(pattern, m.group(1)):
            out[m.group(1)] = re.sub(r"\$L__\w+", "L", m.group(2))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--nvrtc", default="libnvrtc.so.13", help="path of libnvrtc.so")
    ap.add_argument("--arch", default="compute_90")
    ap.add_argument("--match", default="", help="regex on kernel names (default: all)")
    args = ap.parse_args()
    lib = ctypes.CDLL(args.nvrtc)
    a = entries(ptx(lib, args.before, args.arch), args.match)
    b = entries(ptx(lib, args.after, args.arch), args.match)
    differ = 0
    for name in sorted(set(a) | set(b)):
        if name not in a or name not in b:
            state = "only in " + ("after" if name in b else "before")
        else:
            state = "same" if a[name] == b[name] else "DIFFERENT"
        differ += state != "same"
        print(f"{name}: {state}")
    print(f"{len(set(a) | set(b))} kernels, {differ} differ")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
