"""A recording TCP proxy between a subsink worker and nats-server.

The worker's log of its own acks is not evidence: this proxy reads the NATS protocol the worker
sends and logs every JetStream ack (a publish to a `$JS.ACK.…` subject) *before* passing it on,
with the objects visible in the bucket at that moment. What the server sends back passes through
unread.

usage: nats_proxy.py LISTEN_PORT UPSTREAM_PORT LOG [BUCKET_DIR]

LOG gets one JSON object per line; each has "ev" and "t" (time.monotonic(), CLOCK_MONOTONIC,
comparable between processes of this machine):
  {"ev": "ack", "kind": "+ACK", "seqs": [stream sequence, …], "visible"?: [object, …]}
        acks of one kind the worker sent in one read, before they are passed on; "visible" lists
        the objects of BUCKET_DIR then (files below `.subsink-staging/` are not objects)
  {"ev": "ack", "kind": "-NAK" | "+WPI" | "+TERM" | "+NXT", "seqs": […]}

Every ack logged reaches the server: when the worker's connection ends, what the proxy already
read from it is written upstream before the upstream connection is closed.
"""

import asyncio
import json
import os
import sys
import time


class Log:
    def __init__(self, path, bucket):
        self.f = open(path, "a", buffering=1)
        self.bucket = bucket

    def visible(self):
        out = []
        for d, dirs, files in os.walk(self.bucket):
            dirs[:] = [x for x in dirs if x != ".subsink-staging"]
            for f in files:
                out.append(os.path.relpath(os.path.join(d, f), self.bucket))
        return sorted(out)

    def acks(self, by_kind):
        visible = self.visible() if self.bucket and "+ACK" in by_kind else None
        t = time.monotonic()
        for kind, seqs in by_kind.items():
            ev = {"ev": "ack", "kind": kind, "seqs": seqs, "t": t}
            if kind == "+ACK" and visible is not None:
                ev["visible"] = visible
            self.f.write(json.dumps(ev) + "\n")


def ack_seq(subject):
    """The stream sequence of a `$JS.ACK.…` subject (v1: 9 tokens, v2: 11 or 12)."""
    t = subject.split(".")
    if len(t) == 9:
        return int(t[5])
    if len(t) >= 11:
        return int(t[7])
    return None


class ClientStream:
    """Splits what the worker sends into NATS protocol operations."""

    def __init__(self):
        self.buf = b""

    def feed(self, data):
        """The JetStream acks in `data` (with what came before), as {kind: [seq, …]}."""
        self.buf += data
        acks = {}
        while True:
            end = self.buf.find(b"\r\n")
            if end < 0:
                return acks
            line = self.buf[:end]
            op = line.split(b" ", 1)[0].upper()
            if op in (b"PUB", b"HPUB"):
                parts = line.split()
                total = int(parts[-1])
                if len(self.buf) < end + 2 + total + 2:
                    return acks
                payload = self.buf[end + 2 : end + 2 + total]
                if op == b"HPUB":
                    payload = payload[int(parts[-2]) :]
                self.buf = self.buf[end + 2 + total + 2 :]
                subject = parts[1].decode()
                if subject.startswith("$JS.ACK."):
                    seq = ack_seq(subject)
                    kind = payload.split(b" ", 1)[0].decode() or "+ACK"
                    if seq is not None:
                        acks.setdefault(kind, []).append(seq)
            else:
                self.buf = self.buf[end + 2 :]


async def pipe_up(reader, writer, log):
    parser = ClientStream()
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            acks = parser.feed(data)
            if acks:
                log.acks(acks)
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            await writer.drain()
            writer.close()
            await writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def pipe_down(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


def main():
    port, upstream, log_path = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    bucket = sys.argv[4] if len(sys.argv) > 4 else None
    log = Log(log_path, bucket)

    async def handle(creader, cwriter):
        try:
            ureader, uwriter = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cwriter.close()
            return
        await asyncio.gather(pipe_up(creader, uwriter, log), pipe_down(ureader, cwriter))

    async def serve():
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        async with server:
            await server.serve_forever()

    asyncio.run(serve())


if __name__ == "__main__":
    main()
