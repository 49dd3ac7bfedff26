#!/usr/bin/env python3
"""Time `streampool serve` from launch to `/v2/health/ready`, once per scenario.

Each scenario starts the server with its own environment, polls GET /v2/health/ready every
5 ms from the moment of launch (time.monotonic around Popen), then sends one
/v1/embeddings request (the first request's latency: what the warm-up forward is for),
stops the server with SIGTERM and keeps its stderr. The server's own `startup:` line (its
phases, timed from `main`) and the kernel-cache log lines are copied into the summary.

Usage (`scripts/device/run.sh first-use` calls it):
  coldstart.py --bin B --model DIR --out OUT --work WORK [--baseline B0] [--device cpu]
               [--serve-arg A ...]
Writes OUT/coldstart-summary.md, OUT/coldstart.json and OUT/coldstart-runs.log. Standard
library only.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

READY_TIMEOUT_S = 180.0


def wait_ready(port: int, proc: subprocess.Popen, t0: float) -> float | None:
    url = f"http://127.0.0.1:{port}/v2/health/ready"
    while time.monotonic() - t0 < READY_TIMEOUT_S:
        if proc.poll() is not None:
            return None
        try:
            with urllib.request.urlopen(url, timeout=1.0) as r:
                if r.status == 200:
                    return time.monotonic() - t0
        except (urllib.error.URLError, ConnectionError, OSError):
            pass
        time.sleep(0.005)
    return None


def first_request(port: int, model: str) -> tuple[float | None, str]:
    body = json.dumps({"model": model, "input": ["a first request after start-up"]}).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/embeddings", data=body,
        headers={"content-type": "application/json"})
    t = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=60.0) as r:
            payload = json.loads(r.read())
            dim = len(payload["data"][0]["embedding"])
            return (time.monotonic() - t) * 1e3, f"200, dim {dim}"
    except Exception as e:  # noqa: BLE001 - reported, not raised: the table says what failed
        return None, f"error: {e}"


def run(name: str, binary: str, device: str, model_dir: str, port: int, env_extra: dict,
        serve_args: list) -> dict:
    env = dict(os.environ)
    env.update(env_extra)
    env.setdefault("RUST_LOG", "info")
    cmd = [binary, "serve", "--device", device, "--model", model_dir, "--port", str(port), *serve_args]
    err_path = Path(env["COLDSTART_LOG_DIR"]) / f"{name}.stderr"
    with open(err_path, "wb") as err:
        t0 = time.monotonic()
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err)
        ready = wait_ready(port, proc, t0)
        first_ms, first_status = (None, "not ready")
        if ready is not None:
            first_ms, first_status = first_request(port, Path(model_dir).name)
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = err_path.read_text(errors="replace")
    startup = [l for l in log.splitlines() if "startup:" in l]
    kernels = [l for l in log.splitlines() if "kernel" in l.lower()]
    return {
        "run": name,
        "env": env_extra,
        "command": " ".join(cmd),
        "ready_s": ready,
        "first_request_ms": first_ms,
        "first_request": first_status,
        "exit_code": proc.returncode,
        "startup_line": startup[-1] if startup else None,
        "kernel_lines": kernels,
        "stderr": log,
    }


def phases_of(line: str | None) -> str:
    if not line:
        return "(no startup line)"
    m = re.search(r"startup: ready after (.*)$", line)
    return m.group(1) if m else line


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--work", required=True, type=Path)
    ap.add_argument("--baseline", help="an older binary (no disk cache) to time the same way")
    ap.add_argument("--port", type=int, default=18300)
    ap.add_argument("--device", default="cuda", help="cuda (default); cpu to try the script")
    ap.add_argument("--serve-arg", action="append", default=[])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    logs = args.work / "logs"
    shutil.rmtree(args.work, ignore_errors=True)
    logs.mkdir(parents=True)
    os.environ["COLDSTART_LOG_DIR"] = str(logs)
    kc, nv = args.work / "kernel-cache", args.work / "nv-compute-cache"

    def fresh_nv(tag: str) -> str:
        d = args.work / f"nv-{tag}"
        d.mkdir()
        return str(d)

    # (name, binary, environment). CUDA_CACHE_PATH isolates the driver's own PTX JIT cache,
    # so "first" is first for it too; STREAMPOOL_CACHE_DIR is our cubin cache.
    scenarios = [
        ("1-first-ever", args.bin, {"STREAMPOOL_CACHE_DIR": str(kc), "CUDA_CACHE_PATH": str(nv)}),
        ("2-warm-cache", args.bin, {"STREAMPOOL_CACHE_DIR": str(kc), "CUDA_CACHE_PATH": str(nv)}),
        ("3-warm-cache-again", args.bin, {"STREAMPOOL_CACHE_DIR": str(kc), "CUDA_CACHE_PATH": str(nv)}),
        ("4-cache-off", args.bin, {"STREAMPOOL_KERNEL_CACHE": "off", "CUDA_CACHE_PATH": str(nv)}),
        ("5-cache-off-ptx-cold-jit", args.bin,
         {"STREAMPOOL_KERNEL_CACHE": "off", "STREAMPOOL_CUDA_KERNELS": "ptx",
          "CUDA_CACHE_PATH": fresh_nv("ptx")}),
        ("6-warm-cache-no-warm-up", args.bin,
         {"STREAMPOOL_CACHE_DIR": str(kc), "CUDA_CACHE_PATH": str(nv), "COLDSTART_NO_WARM_UP": "1"}),
    ]
    if args.baseline:
        scenarios.append(("7-baseline-binary-cold-jit", args.baseline, {"CUDA_CACHE_PATH": fresh_nv("base")}))

    results = []
    for i, (name, binary, env_extra) in enumerate(scenarios):
        extra = list(args.serve_arg)
        if env_extra.pop("COLDSTART_NO_WARM_UP", None):
            extra.append("--no-warm-up")
        r = run(name, binary, args.device, args.model, args.port + i, env_extra, extra)
        results.append(r)
        ready = f"{r['ready_s']:.2f} s" if r["ready_s"] is not None else "NOT READY"
        first = f"{r['first_request_ms']:.1f} ms" if r["first_request_ms"] is not None else r["first_request"]
        print(f"{name}: ready {ready}, first request {first}", flush=True)

    entries = sorted(p.name for p in kc.glob("*.spk")) if kc.exists() else []
    sizes = [(kc / e).stat().st_size for e in entries]
    with open(args.out / "coldstart-runs.log", "w") as f:
        for r in results:
            f.write(f"===== {r['run']}: {r['command']}\n env {r['env']}\n")
            f.write(r["stderr"])
            f.write("\n")
    with open(args.out / "coldstart.json", "w") as f:
        json.dump({"results": [{k: v for k, v in r.items() if k != "stderr"} for r in results],
                   "cache_entries": dict(zip(entries, sizes))}, f, indent=2)
    lines = [
        "| run | launch to ready | first request | server's phases (own time, from-to since main) |",
        "|---|---|---|---|",
    ]
    for r in results:
        ready = f"{r['ready_s']:.2f} s" if r["ready_s"] is not None else "not ready"
        first = f"{r['first_request_ms']:.1f} ms" if r["first_request_ms"] is not None else r["first_request"]
        lines.append(f"| {r['run']} | {ready} | {first} | {phases_of(r['startup_line'])} |")
    lines.append("")
    lines.append(f"kernel cache after the runs: {len(entries)} entries, bytes {sizes}")
    for r in results:
        for k in r["kernel_lines"]:
            lines.append(f"- {r['run']}: `{k.strip()[:300]}`")
    text = "\n".join(lines) + "\n"
    (args.out / "coldstart-summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
