#!/usr/bin/env python3
"""Checking load client of scripts/replicas-test.sh (Python stdlib only).

  replicas_client.py ready URL...            wait until every URL's /v2/health/ready is 200
  replicas_client.py reference BIN OUT URL...
      the known answers: tiny-bert embeddings from `BIN embed --json` (in-process, no server)
      and the MLP's outputs from the first replica, checked equal on every other replica
  replicas_client.py load REF URL OUT --threads T --seconds S --max-requests N --timeout T
      a bounded load run through URL (the balancer): every thread sends requests in turn
      (embeddings of known texts, MLP inference of known rows) on its own keep-alive
      connection, and checks each answer against the known one. Writes counts as JSON.
  replicas_client.py report LOAD_JSON ACCESS_LOG --ports P1 P2 P3 --times ... (markdown)
      the run's table: the load counts and what nginx's access log shows, per phase

Every request has a client timeout; a request that hits it is counted as a hang. An answer
with a non-200 status is a clear error (counted by status); a 200 whose values differ from
the known answer is a mismatch. The run stops after S seconds or N requests, whichever is
first.
"""

import argparse
import http.client
import json
import math
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

TEXTS = [f"replica test sentence {k}: the quick brown fox jumps over {k} lazy dogs" for k in range(16)]
MLP_WIDTH = 256
MLP_ROWS = 16
# Embeddings: the server batches inputs of different lengths together (padding + attention
# mask), the reference embeds them in one batch of its own: equal to float rounding only.
EMB_TOL = 1e-4
# MLP rows are independent in a batch: equal to float rounding.
MLP_TOL = 1e-5


def mlp_row(k):
    return [round(math.sin(0.37 * k + 0.11 * j), 6) for j in range(MLP_WIDTH)]


def emb_body(k):
    return {"model": "tiny-bert", "input": [TEXTS[k]]}


def mlp_body(k):
    return {"inputs": [{"name": "input", "shape": [1, MLP_WIDTH], "datatype": "FP32", "data": mlp_row(k)}]}


EMB_PATH = "/v1/embeddings"
MLP_PATH = "/v2/models/mlp/infer"


def post(url, path, body, timeout=10.0):
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def close(a, b, tol):
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(x), abs(y)) for x, y in zip(a, b))


def cmd_ready(urls):
    deadline = time.monotonic() + 60
    for url in urls:
        while True:
            try:
                with urllib.request.urlopen(url + "/v2/health/ready", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                sys.exit(f"{url} not ready within 60 s")
            time.sleep(0.1)


def cmd_reference(binary, out, urls):
    emb = json.loads(subprocess.run([binary, "embed", "--json", *TEXTS], check=True,
                                    capture_output=True, text=True).stdout)
    embeddings = [e["embedding"] for e in emb["embeddings"]]
    mlp = [post(urls[0], MLP_PATH, mlp_body(k))["outputs"][0]["data"] for k in range(MLP_ROWS)]
    # The known answers must be what every replica gives (same binary, same seed), and the
    # in-process embeddings what the servers give.
    for url in urls:
        for k in range(MLP_ROWS):
            got = post(url, MLP_PATH, mlp_body(k))["outputs"][0]["data"]
            if not close(got, mlp[k], MLP_TOL):
                sys.exit(f"replica {url} disagrees on MLP row {k}")
        for k in range(len(TEXTS)):
            got = post(url, EMB_PATH, emb_body(k))["data"][0]["embedding"]
            if not close(got, embeddings[k], EMB_TOL):
                sys.exit(f"replica {url} disagrees with `embed` on text {k}")
    with open(out, "w") as f:
        json.dump({"embeddings": embeddings, "mlp": mlp}, f)
    print(f"reference: {len(TEXTS)} embeddings (dim {len(embeddings[0])}) from `embed`, "
          f"{MLP_ROWS} MLP rows; all {len(urls)} replicas agree")


class Counts:
    def __init__(self):
        self.lock = threading.Lock()
        self.sent = 0
        self.ok = 0
        self.errors = {}      # "HTTP 503" / "ConnectionResetError" -> count
        self.mismatches = 0
        self.hangs = 0
        self.latencies = []
        self.max_diff = 0.0
        self.timeline = []    # (t, outcome) of every non-ok answer

    def add_error(self, t, what):
        self.errors[what] = self.errors.get(what, 0) + 1
        self.timeline.append((round(t, 3), what))


def cmd_load(ref_path, url, out, threads, seconds, max_requests, timeout):
    with open(ref_path) as f:
        ref = json.load(f)
    u = urllib.parse.urlsplit(url)
    counts = Counts()
    start = time.monotonic()
    deadline = start + seconds
    ticket = iter(range(max_requests))
    ticket_lock = threading.Lock()

    def next_ticket():
        with ticket_lock:
            return next(ticket, None)

    def worker():
        conn = None
        while time.monotonic() < deadline:
            i = next_ticket()
            if i is None:
                break
            is_emb = i % 2 == 0
            k = (i // 2) % (len(TEXTS) if is_emb else MLP_ROWS)
            path, body = (EMB_PATH, emb_body(k)) if is_emb else (MLP_PATH, mlp_body(k))
            t0 = time.monotonic()
            outcome = None
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
                conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
                resp = conn.getresponse()
                data = resp.read()
                if resp.status != 200:
                    outcome = f"HTTP {resp.status}"
                else:
                    v = json.loads(data)
                    got = v["data"][0]["embedding"] if is_emb else v["outputs"][0]["data"]
                    want = ref["embeddings"][k] if is_emb else ref["mlp"][k]
                    tol = EMB_TOL if is_emb else MLP_TOL
                    diff = max((abs(a - b) for a, b in zip(got, want)), default=math.inf)
                    outcome = "ok" if close(got, want, tol) else "mismatch"
                if resp.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (socket.timeout, TimeoutError):
                outcome = "hang"
            except (OSError, http.client.HTTPException, ValueError, KeyError) as e:
                outcome = type(e).__name__
            if outcome not in ("ok", "mismatch") and conn is not None:
                conn.close()
                conn = None
            t1 = time.monotonic()
            with counts.lock:
                counts.sent += 1
                if outcome == "ok":
                    counts.ok += 1
                    counts.latencies.append(t1 - t0)
                    counts.max_diff = max(counts.max_diff, diff)
                elif outcome == "mismatch":
                    counts.mismatches += 1
                    counts.timeline.append((round(t0 - start, 3), "mismatch"))
                elif outcome == "hang":
                    counts.hangs += 1
                    counts.timeline.append((round(t0 - start, 3), "hang"))
                else:
                    counts.add_error(t0 - start, outcome)
        if conn is not None:
            conn.close()

    pool = [threading.Thread(target=worker) for _ in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    elapsed = time.monotonic() - start
    lat = sorted(counts.latencies)

    def pct(p):
        return round(1e3 * lat[min(len(lat) - 1, int(p * len(lat)))], 2) if lat else None

    result = {
        "threads": threads, "seconds": round(elapsed, 2), "client_timeout_s": timeout,
        "sent": counts.sent, "ok": counts.ok, "errors": counts.errors,
        "mismatches": counts.mismatches, "hangs": counts.hangs,
        "ok_per_s": round(counts.ok / elapsed, 1),
        "latency_ms": {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0)},
        "max_abs_diff_vs_reference": counts.max_diff,
        "not_ok_timeline": counts.timeline[:200],
    }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "not_ok_timeline"}))


def cmd_report(load_path, access_log, ports, times, term_status, drain_timeout):
    """The markdown table of a run: the client's counts and what nginx's access log shows."""
    import collections
    import re
    t0, t_term, t_kill, t_exit, t_restart, t_end = times
    r = json.load(open(load_path))
    names = {f"127.0.0.1:{p}": f"replica {i + 1}" for i, p in enumerate(ports)}
    phases = [("before SIGTERM", t_term), ("SIGTERM to SIGKILL", t_kill),
              ("SIGKILL to restart", t_restart), ("after restart", math.inf)]
    tries = collections.Counter()        # (phase, replica) -> tries
    failed = collections.Counter()       # "replica N: status" -> tries
    logged = retried = 0
    for line in open(access_log):
        m = re.match(r'(\S+) (\d+) "([^"]*)" "([^"]*)"', line)
        if not m:
            continue
        logged += 1
        t = float(m[1])
        # "a, b" (retried on b) or "a : b" (a second upstream group); statuses likewise.
        addrs = [a for a in re.split(r"\s*[,:]\s+", m[3]) if a]
        statuses = [u for u in re.split(r"\s*[,:]\s+", m[4]) if u]
        retried += len(addrs) > 1
        phase = next(name for name, end in phases if t < end)
        for a in addrs:
            tries[(phase, names.get(a, a))] += 1
        for a, u in zip(addrs, statuses):
            if u != "200":
                failed[f"{names.get(a, a)}: {u}"] += 1
    errs = ", ".join(f"{k}: {v}" for k, v in sorted(r["errors"].items())) or "none"
    lat = r["latency_ms"]
    verdict = "PASS" if r["mismatches"] == 0 and r["hangs"] == 0 and r["ok"] > 0 else "FAIL"
    fails = ", ".join(f"{k} x{v}" for k, v in sorted(failed.items())) or "none"
    rows = [
        ("requests sent", r["sent"]),
        ("answered 200 with the right answer", f"**{r['ok']}** ({r['ok_per_s']}/s)"),
        ("clear errors (HTTP status, or connection error)", f"{sum(r['errors'].values())} ({errs})"),
        ("mismatched answers", f"**{r['mismatches']}**"),
        (f"hangs (client timeout of {r['client_timeout_s']} s hit)", f"**{r['hangs']}**"),
        ("right answers: latency p50 / p99 / max", f"{lat['p50']} / {lat['p99']} / {lat['max']} ms"),
        ("largest difference from a known answer", f"{r['max_abs_diff_vs_reference']:.1e}"),
        ("nginx: requests logged / sent on to another replica", f"{logged} / {retried}"),
        ("nginx: tries that failed (replica: status; 502 = no answer)", fails),
    ]
    print("| | |\n|---|---:|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    print("\nTries per replica in each phase (nginx's access log; a retried request counts once on"
          " every replica it tried):\n")
    print("| phase | " + " | ".join(names.values()) + " |")
    print("|---|" + "---:|" * len(names))
    for name, _ in phases:
        print(f"| {name} | " + " | ".join(str(tries[(name, n)]) for n in names.values()) + " |")
    print(f"\nEvents, seconds into the load run: SIGTERM replica 2 at {t_term - t0:.2f}; SIGKILL"
          f" replica 3 at {t_kill - t0:.2f}; replica 2 started again at {t_restart - t0:.2f}; load"
          f" ended at {t_end - t0:.2f}. Replica 2 exited {t_exit - t_term:.2f} s after its SIGTERM"
          f" with exit status {term_status} (drain timeout {drain_timeout} s).")
    print(f"\nVerdict: **{verdict}** (mismatches and hangs must be 0).")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("ready")
    r.add_argument("urls", nargs="+")
    r = sub.add_parser("reference")
    r.add_argument("binary")
    r.add_argument("out")
    r.add_argument("urls", nargs="+")
    r = sub.add_parser("load")
    r.add_argument("ref")
    r.add_argument("url")
    r.add_argument("out")
    r.add_argument("--threads", type=int, default=16)
    r.add_argument("--seconds", type=float, default=20)
    r.add_argument("--max-requests", type=int, default=200000)
    r.add_argument("--timeout", type=float, default=40)
    r = sub.add_parser("report")
    r.add_argument("load")
    r.add_argument("access_log")
    r.add_argument("--ports", nargs=3, required=True)
    r.add_argument("--times", nargs=6, type=float, required=True,
                   help="epoch seconds: load start, SIGTERM, SIGKILL, replica 2 exited, restart, end")
    r.add_argument("--term-status", required=True)
    r.add_argument("--drain-timeout", required=True)
    a = p.parse_args()
    if a.cmd == "ready":
        cmd_ready(a.urls)
    elif a.cmd == "reference":
        cmd_reference(a.binary, a.out, a.urls)
    elif a.cmd == "load":
        cmd_load(a.ref, a.url, a.out, a.threads, a.seconds, a.max_requests, a.timeout)
    else:
        cmd_report(a.load, a.access_log, a.ports, a.times, a.term_status, a.drain_timeout)


if __name__ == "__main__":
    main()
