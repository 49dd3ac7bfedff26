#!/usr/bin/env python3
"""What one large request costs a live `streampool serve`: server CPU seconds per MB of body
and peak memory growth for each route and text class, a one-sentence client's latency
while four such requests run, and resident memory after the burst.

The server runs as its own process (CPU backend, the shipped tiny embedder and XLM-R
reranker unless --model is given), so /proc gives its CPU time and memory alone. Peak memory
is read as VmHWM after resetting it (/proc/PID/clear_refs), so each class's peak is its own.

    cargo build --release -p streampool-cli
    python3 bench/request_cost.py --bin target/release/streampool --out bench/results/request-cost

Prints a markdown table (the serve README's) and writes request-cost.json to --out.
"""

import argparse
import http.client
import json
import os
import platform
import statistics
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODELS = os.path.join(HERE, "..", "models")
CLK_TCK = os.sysconf("SC_CLK_TCK")
REPEAT = 5


def cases():
    """(route, text class, path, body, expected status): each class of the request-cost
    table, bodies just under the default 4 MiB limit where the class is about size."""
    words = [f"w{i}" for i in range(256)]

    def j(v):
        return json.dumps(v, ensure_ascii=False).encode()

    return [
        ("/rerank", "1 MiB query, 256 one-word texts, truncate", "/rerank",
         j({"query": "word " * 200_000, "texts": words, "truncate": True}), 200),
        ("/rerank", "one text of U+FDFA x 1.3M (NFKC 18x), truncate", "/rerank",
         j({"query": "q", "texts": ["\ufdfa" * 1_300_000], "truncate": True}), 200),
        ("/v1/embeddings", "256 inputs, 1 MiB non-ASCII prompt", "/v1/embeddings",
         j({"input": ["a"] * 256, "prompt": "é" * 500_000}), 400),
        ("/embed", "4 MB Chinese, truncate", "/embed",
         j({"inputs": "北京" * 690_000, "truncate": True}), 200),
        ("/embed", "4 MB Hangul, truncate", "/embed",
         j({"inputs": "한국어 " * 400_000, "truncate": True}), 200),
        ("/embed", "4 MB accented Latin, truncate", "/embed",
         j({"inputs": "café naïve " * 310_000, "truncate": True}), 200),
        ("/embed", "4 MB emoji, truncate", "/embed",
         j({"inputs": "🙂" * 1_030_000, "truncate": True}), 200),
        ("/embed", "4 MB ASCII, not truncating", "/embed",
         j({"inputs": "word " * 830_000}), 413),
        ("/embed", "256 x 16 KB ASCII, truncate", "/embed",
         j({"inputs": ["word " * 3_200] * 256, "truncate": True}), 200),
        ("/predict", "4 MB ASCII, truncate", "/predict",
         j({"inputs": "word " * 830_000, "truncate": True}), 200),
        ("/predict", "120 pairs of 16 KB, truncate", "/predict",
         j({"inputs": [["query " * 3_000, "text " * 3_200]] * 120, "truncate": True}), 200),
        ("KServe", "256 texts, 1 MiB prompt parameter", "/v2/models/{embedder}/infer",
         j({"inputs": [{"name": "text", "shape": [256], "datatype": "BYTES",
                        "data": ["a"] * 256}],
            "parameters": {"prompt": "é" * 500_000}}), 400),
        ("KServe", "256 non-ASCII texts of 16 KB, not truncating", "/v2/models/{embedder}/infer",
         j({"inputs": [{"name": "text", "shape": [256], "datatype": "BYTES",
                        "data": ["北京 café " * 1_200] * 256}]}), 400),
    ]


class Server:
    def __init__(self, binary, models, extra):
        args = [binary, "serve", "--device", "cpu", "--port", "0", "--no-mlp"]
        for m in models:
            args += ["--model", m]
        self.proc = subprocess.Popen(args + extra, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline()
        self.port = int(line.split("127.0.0.1:")[1].split()[0].rstrip(")"))
        self.pid = self.proc.pid

    def cpu_s(self):
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK

    def status(self, field):
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
        raise KeyError(field)

    def reset_peak(self):
        with open(f"/proc/{self.pid}/clear_refs", "w") as f:
            f.write("5")

    def stop(self):
        self.proc.kill()
        self.proc.wait()


def post(port, path, body, timeout=300):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "target", "release", "streampool"))
    ap.add_argument("--model", action="append",
                    help="model folders to serve (default: tiny-bert and tiny-xlmr-reranker)")
    ap.add_argument("--out", help="folder for request-cost.json")
    args = ap.parse_args()
    models = args.model or [os.path.join(MODELS, "tiny-bert"),
                            os.path.join(MODELS, "tiny-xlmr-reranker")]
    embedder = os.path.basename(os.path.normpath(models[0]))
    s = Server(args.bin, models, [])
    small = json.dumps({"inputs": "a short sentence"}).encode()
    for _ in range(50):
        post(s.port, "/embed", small)
    rows = []
    for route, what, path, body, want in cases():
        path = path.format(embedder=embedder)
        before_rss = s.status("VmRSS:")
        s.reset_peak()
        cpu0, t0 = s.cpu_s(), time.perf_counter()
        # Five times: /proc counts CPU time in 10 ms ticks.
        for _ in range(REPEAT):
            status, answer = post(s.port, path, body)
        wall = (time.perf_counter() - t0) / REPEAT
        cpu = (s.cpu_s() - cpu0) / REPEAT
        peak = s.status("VmHWM:") - before_rss
        mb = len(body) / 1e6
        rows.append({
            "route": route, "class": what, "body_bytes": len(body), "status": status,
            "repeats": REPEAT,
            "expected_status": want, "cpu_s": round(cpu, 3), "cpu_s_per_mb": round(cpu / mb, 3),
            "wall_s": round(wall, 3), "peak_rss_growth_bytes": peak,
            "peak_rss_growth_per_body": round(peak / len(body), 2),
            "answer_bytes": len(answer),
        })
    # Four clients sending every heavy class that succeeds, while one client sends one
    # sentence every 10 ms: its latency, and resident memory before, during and after.
    heavy = [(p.format(embedder=embedder), b) for _, _, p, b, w in cases() if w == 200]
    rss_before = s.status("VmRSS:")
    s.reset_peak()
    stop = threading.Event()

    def heavy_client():
        for path, body in heavy:
            post(s.port, path, body)

    clients = [threading.Thread(target=heavy_client) for _ in range(4)]
    cpu0, t0 = s.cpu_s(), time.perf_counter()
    for c in clients:
        c.start()
    lat = []
    while any(c.is_alive() for c in clients):
        t = time.perf_counter()
        st, _ = post(s.port, "/embed", small)
        assert st == 200
        lat.append((time.perf_counter() - t) * 1e3)
        time.sleep(0.01)
    for c in clients:
        c.join()
    burst_s = time.perf_counter() - t0
    burst_cpu = s.cpu_s() - cpu0
    peak_rss = s.status("VmHWM:")
    time.sleep(3)
    rss_after = s.status("VmRSS:")
    stop.set()
    s.stop()
    lat.sort()
    burst = {
        "heavy_clients": 4, "heavy_requests": 4 * len(heavy),
        "heavy_bytes": 4 * sum(len(b) for _, b in heavy), "burst_s": round(burst_s, 2),
        "burst_cpu_s": round(burst_cpu, 2), "small_requests": len(lat),
        "small_p50_ms": round(statistics.median(lat), 2),
        "small_p99_ms": round(lat[min(len(lat) - 1, int(0.99 * len(lat)))], 2),
        "small_max_ms": round(lat[-1], 2),
        "rss_before_bytes": rss_before, "rss_peak_bytes": peak_rss,
        "rss_3s_after_bytes": rss_after,
        "rss_after_over_before": round(rss_after / rss_before, 3),
    }
    result = {
        "date": time.strftime("%Y-%m-%d"), "machine": platform.node(),
        "cpus": os.cpu_count(), "binary": os.path.abspath(args.bin), "models": models,
        "cases": rows, "burst": burst,
    }
    print("| route | request | body | status | server CPU | CPU s/MB | peak RSS growth (x body) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['route']} | {r['class']} | {r['body_bytes'] / 1e6:.2f} MB | {r['status']} "
              f"| {r['cpu_s']:.3f} s | {r['cpu_s_per_mb']:.3f} | "
              f"{r['peak_rss_growth_per_body']:.1f}x |")
    print(f"\nburst: {burst['heavy_requests']} heavy requests from 4 clients "
          f"({burst['heavy_bytes'] / 1e6:.0f} MB) in {burst['burst_s']} s, "
          f"{burst['burst_cpu_s']} s CPU; one-sentence client p50 {burst['small_p50_ms']} ms, "
          f"p99 {burst['small_p99_ms']} ms, max {burst['small_max_ms']} ms "
          f"({burst['small_requests']} requests); RSS {rss_before / 2**20:.0f} MiB before, "
          f"{peak_rss / 2**20:.0f} MiB peak, {rss_after / 2**20:.0f} MiB 3 s after")
    bad = [r for r in rows if r["status"] != r["expected_status"]]
    if bad:
        print("unexpected statuses:", bad)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "request-cost.json"), "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
