#!/usr/bin/env python3
"""Idle and slow-header connections against a running `streampool serve`, with a valid
client's latency alongside.

Opens IDLE connections that send nothing and SLOW connections that send a request's headers
one byte every SLOW_EVERY seconds, and records when the server closes each. Meanwhile two valid
clients each send one small request every 100 ms and record each latency or error: "fresh"
opens a new connection per request (what a client without a pool does, and what a connection
cap or an exhausted descriptor table refuses first), "pooled" reuses one keep-alive
connection opened before the flood (a balancer's pool), reconnecting if it is closed. Prints
one JSON object.

    python3 bench/conn_flood.py --url http://127.0.0.1:8000 --idle 2000 --slow 200 --seconds 30
"""

import argparse
import asyncio
import json
import statistics
import time
import urllib.parse

VALID = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
VALID_KEEP = b"GET /v2/health/live HTTP/1.1\r\nhost: x\r\n\r\n"
SLOW_HEAD = b"POST /v2/models/mlp/infer HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"


async def held(host, port, slow_every, seconds, out):
    """One connection: idle (slow_every None) or trickling headers. Appends how long the
    server kept it open (None: still open at the end), or the connect error."""
    began = time.monotonic()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
    except (OSError, asyncio.TimeoutError, TimeoutError) as e:
        out.append({"error": type(e).__name__})
        return
    deadline = began + seconds

    async def trickle():
        i = 0
        while True:
            await asyncio.sleep(slow_every)
            writer.write(SLOW_HEAD[i % len(SLOW_HEAD) : i % len(SLOW_HEAD) + 1])
            await writer.drain()
            i += 1

    trickler = asyncio.create_task(trickle()) if slow_every else None
    closed = None
    try:
        while time.monotonic() < deadline:
            data = await asyncio.wait_for(reader.read(4096), deadline - time.monotonic())
            if not data:
                closed = time.monotonic() - began
                break
    except (asyncio.TimeoutError, TimeoutError):
        pass
    except OSError:
        closed = time.monotonic() - began
    if trickler:
        trickler.cancel()
    writer.close()
    out.append({"closed_after_s": closed})


async def valid_client(host, port, seconds, out):
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        try:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            writer.write(VALID)
            await writer.drain()
            data = await asyncio.wait_for(reader.read(), 10)
            status = int(data.split(b" ", 2)[1]) if data else None
            writer.close()
            out.append({"t": t, "latency_s": time.monotonic() - t, "status": status})
        except (OSError, asyncio.TimeoutError, TimeoutError, ValueError, IndexError) as e:
            out.append({"t": t, "latency_s": time.monotonic() - t, "error": type(e).__name__})
        await asyncio.sleep(0.1)


async def read_response(reader):
    """Status of one keep-alive response (reads its head and content-length body)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":", 1)[1])
    await reader.readexactly(length)
    return int(head.split(b" ", 2)[1])


async def pooled_client(host, port, seconds, started, out):
    conn = None
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        t = time.monotonic()
        try:
            if conn is None:
                conn = await asyncio.wait_for(asyncio.open_connection(host, port), 10)
            reader, writer = conn
            writer.write(VALID_KEEP)
            await writer.drain()
            status = await asyncio.wait_for(read_response(reader), 10)
            out.append({"t": t, "latency_s": time.monotonic() - t, "status": status})
        except (OSError, asyncio.TimeoutError, TimeoutError, ValueError, IndexError,
                asyncio.IncompleteReadError) as e:
            out.append({"t": t, "latency_s": time.monotonic() - t, "error": type(e).__name__})
            if conn is not None:
                conn[1].close()
            conn = None
        started.set()
        await asyncio.sleep(0.1)


def answers(rows):
    ok = [v["latency_s"] for v in rows if v.get("status") == 200]
    statuses = {}
    for v in rows:
        k = str(v.get("status", v.get("error")))
        statuses[k] = statuses.get(k, 0) + 1
    return {"answers": statuses, "latency_s_of_200": summary(ok)}


def summary(xs):
    if not xs:
        return None
    xs = sorted(xs)
    return {
        "n": len(xs),
        "min": round(xs[0], 3),
        "p50": round(statistics.median(xs), 3),
        "p99": round(xs[min(len(xs) - 1, int(0.99 * len(xs)))], 3),
        "max": round(xs[-1], 3),
    }


def held_summary(rows):
    closed = [r["closed_after_s"] for r in rows if r.get("closed_after_s") is not None]
    return {
        "opened": sum(1 for r in rows if "error" not in r),
        "connect_errors": sum(1 for r in rows if "error" in r),
        "closed_by_server": len(closed),
        "still_open_at_end": sum(1 for r in rows if "error" not in r and r["closed_after_s"] is None),
        "closed_after_s": summary(closed),
    }


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--slow", type=int, default=200)
    ap.add_argument("--slow-every", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=30.0)
    args = ap.parse_args()
    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname, u.port
    idle, slow, fresh, pooled = [], [], [], []
    started = asyncio.Event()
    pool = asyncio.create_task(pooled_client(host, port, args.seconds, started, pooled))
    await started.wait()
    tasks = [valid_client(host, port, args.seconds, fresh)]
    tasks += [held(host, port, None, args.seconds, idle) for _ in range(args.idle)]
    tasks += [held(host, port, args.slow_every, args.seconds, slow) for _ in range(args.slow)]
    await asyncio.gather(*tasks)
    await pool
    print(
        json.dumps(
            {
                "idle": held_summary(idle),
                "slow_headers": held_summary(slow),
                "valid_fresh_connection": answers(fresh),
                "valid_pooled_connection": answers(pooled),
                "args": vars(args),
            },
            indent=1,
        )
    )


asyncio.run(main())
