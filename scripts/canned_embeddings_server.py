#!/usr/bin/env python3
"""A server that answers every POST with one fixed OpenAI embeddings answer of 32 x 384
floats (as `streampool serve` writes them for all-MiniLM-L6-v2 and 32 inputs), to measure
`streampool loadgen`'s own CPU per answer with no model behind it. GET answers 404 (so the
load generator finds no /metrics).

Usage: python3 scripts/canned_embeddings_server.py PORT [float|base64]
  then: streampool loadgen --url http://127.0.0.1:PORT -c 4 -k 32 [--encoding base64]
The "lg cpu" column over req/s is the load generator's CPU per answer.
"""
import asyncio
import base64
import random
import struct
import sys

PORT = int(sys.argv[1])
ENCODING = sys.argv[2] if len(sys.argv) > 2 else "float"
random.seed(1)
rows = [struct.pack("<384f", *(random.gauss(0, 0.05) for _ in range(384))) for _ in range(32)]


def embedding(raw: bytes) -> str:
    if ENCODING == "base64":
        return '"%s"' % base64.b64encode(raw).decode()
    # The shortest text that reads back as the same f32 (what serde_json writes).
    values = []
    for (x,) in struct.iter_unpack("<f", raw):
        for digits in range(1, 10):
            text = "%.*g" % (digits, x)
            if struct.unpack("<f", struct.pack("<f", float(text)))[0] == x:
                break
        values.append(text)
    return "[" + ",".join(values) + "]"


items = ",".join(
    '{"object":"embedding","index":%d,"embedding":%s}' % (i, embedding(r)) for i, r in enumerate(rows)
)
body = ('{"object":"list","data":[%s],"model":"m","usage":{"prompt_tokens":0,"total_tokens":0}}' % items).encode()
ANSWER = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
NOT_FOUND = b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
print(f"{ENCODING} answer of {len(body)} bytes on port {PORT}", flush=True)


async def handle(reader, writer):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            if length:
                await reader.readexactly(length)
            writer.write(NOT_FOUND if head.startswith(b"GET") else ANSWER)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        writer.close()


async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", PORT)
    async with server:
        await server.serve_forever()


asyncio.run(main())
