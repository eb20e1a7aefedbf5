"""A recording gRPC proxy between a subsink worker and the Pub/Sub emulator.

The worker's view of its own acks is not evidence: this proxy sees every call on the wire, in the
order the worker makes them, and writes what it saw to a log *before* passing a call on. With it a
test can check what a worker claims, e.g. that a message is acknowledged only after the object
holding it is visible in the bucket.

usage: pubsub_proxy.py LISTEN_PORT UPSTREAM_HOST:PORT LOG [BUCKET_DIR] [--flow-control]

With --flow-control the proxy enforces the flow control the emulator ignores, as Pub/Sub does:
each stream (client id) gets no more messages while the messages delivered on it and not yet
acked, nacked or expired reach the `max_outstanding_messages` of its first request, or their bytes
(each message's serialized size) its `max_outstanding_bytes` (0: no limit). A message past the
limit is withheld — the proxy stops reading the upstream stream — until enough are settled. A
modack of more than 0 s moves a message's deadline; one that is never settled stops counting when
its deadline (`stream_ack_deadline_seconds`, then the last modack) passes.

Prints "ready" on stdout once it listens. LOG gets one JSON object per line; each has "ev" and
"t" (time.monotonic(), CLOCK_MONOTONIC, comparable between processes of this machine):
  {"ev": "deliver", "ack_id", "message_id", "attempt", "attributes"}  a message sent to the worker
  {"ev": "ack", "ack_ids", "visible"?}   an Acknowledge (or acks on the stream) before it is passed
                                         on; "visible" lists the objects of BUCKET_DIR at that
                                         moment (staging files, named `…#N`, are not objects)

Every ack logged reaches the server: when a worker dies mid-stream, the proxy closes its side of
the upstream stream after the requests it already logged instead of cancelling it.
  {"ev": "modack", "ack_ids", "seconds"} a ModifyAckDeadline (0 s is a nack)
  {"ev": "publish", "topic", "count"}    a Publish
  {"ev": "withhold", "client_id", "outstanding", "bytes"}  --flow-control: the stream is held back
                                         (once each time it fills)

Faults on demand: while the file LOG.faults exists it holds a JSON object mapping a method name
(`ListSubscriptions`, `StreamingPull`, `Publish`, …) to a list of gRPC status code names
(`UNAVAILABLE`, `PERMISSION_DENIED`, …). Each call of that method takes the first code off its
list (the file is rewritten) and is answered with it, without reaching the server; an empty list
passes calls on again. Each fault answered is appended to LOG.faults.log as
{"method", "code", "t"}.
"""

import argparse
import json
import os
import threading
import time
from concurrent import futures

import grpc
from google.pubsub_v1.types import (
    AcknowledgeRequest,
    ModifyAckDeadlineRequest,
    PublishRequest,
    StreamingPullRequest,
    StreamingPullResponse,
)

PB = {
    "ack": AcknowledgeRequest.pb(),
    "modack": ModifyAckDeadlineRequest.pb(),
    "publish": PublishRequest.pb(),
    "spreq": StreamingPullRequest.pb(),
    "spresp": StreamingPullResponse.pb(),
}
def timeout_of(ctx):
    """The caller's deadline, if it set one (without one gRPC reports an enormous number)."""
    t = ctx.time_remaining()
    return t if t is not None and t < 86400 else None


UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class Log:
    def __init__(self, path, bucket):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()
        self.bucket = bucket

    def visible(self):
        out = []
        for d, _, files in os.walk(self.bucket):
            for f in files:
                if "#" not in f:
                    out.append(os.path.relpath(os.path.join(d, f), self.bucket))
        return sorted(out)

    def write(self, ev, **kw):
        kw["ev"] = ev
        with self.lock:
            if ev == "ack" and self.bucket:
                # Listed under the lock and before the ack goes on: what a reader of the bucket
                # sees at the moment the worker acknowledges.
                kw["visible"] = self.visible()
            kw["t"] = time.monotonic()
            self.f.write(json.dumps(kw) + "\n")


class Faults:
    """The faults of LOG.faults (see the module doc), taken one call at a time."""

    def __init__(self, log_path):
        self.path = log_path + ".faults"
        self.done = open(log_path + ".faults.log", "a", buffering=1)
        self.lock = threading.Lock()

    def take(self, method):
        """The status code this call of `method` must fail with, if any."""
        with self.lock:
            try:
                with open(self.path) as f:
                    plan = json.load(f)
            except (FileNotFoundError, json.JSONDecodeError):
                return None
            codes = plan.get(method) or []
            if not codes:
                return None
            code = codes.pop(0)
            tmp = self.path + ".tmp"
            with open(tmp, "w") as f:
                json.dump(plan, f)
            os.replace(tmp, self.path)
            self.done.write(json.dumps({"method": method, "code": code, "t": time.monotonic()}) + "\n")
            return getattr(grpc.StatusCode, code)




class FlowControl:
    """Pub/Sub's flow control, per stream (client id): what each stream has outstanding, and a
    wait for room. One lock and condition for every stream."""

    def __init__(self, log):
        self.log = log
        self.cond = threading.Condition()
        # ack id -> [client id, bytes, deadline (monotonic)]
        self.outstanding = {}
        # client id -> [messages, bytes]
        self.totals = {}

    def _expire(self):
        now = time.monotonic()
        for a in [a for a, o in self.outstanding.items() if o[2] <= now]:
            self._drop(a)

    def _drop(self, ack_id):
        o = self.outstanding.pop(ack_id, None)
        if o is not None:
            t = self.totals[o[0]]
            t[0] -= 1
            t[1] -= o[1]

    def settle(self, ack_ids):
        """Acks and nacks: no longer outstanding."""
        with self.cond:
            for a in ack_ids:
                self._drop(a)
            self.cond.notify_all()

    def extend(self, ack_id, seconds):
        with self.cond:
            o = self.outstanding.get(ack_id)
            if o is not None:
                o[2] = time.monotonic() + seconds

    def admit(self, first, ack_id, size, active):
        """Wait until the stream of `first` (its first request) has room for one more message,
        then count it. False: the worker is gone, or `active` is None (do not wait) and there is
        no room now."""
        client = first.client_id
        max_n, max_b = first.max_outstanding_messages, first.max_outstanding_bytes
        with self.cond:
            t = self.totals.setdefault(client, [0, 0])

            def full():
                return (max_n > 0 and t[0] >= max_n) or (
                    max_b > 0 and t[0] > 0 and t[1] + size > max_b
                )

            if full():
                self._expire()
            logged = False
            while full():
                if active is None:
                    return False
                if not logged:
                    self.log.write("withhold", client_id=client, outstanding=t[0], bytes=t[1])
                    logged = True
                self.cond.wait(0.2)
                self._expire()
                if not active():
                    return False
            deadline = time.monotonic() + (first.stream_ack_deadline_seconds or 10)
            self.outstanding[ack_id] = [client, size, deadline]
            t[0] += 1
            t[1] += size
            return True


class Proxy(grpc.GenericRpcHandler):
    def __init__(self, upstream, log, flow_control, faults):
        self.channel = grpc.insecure_channel(upstream, options=UNLIMITED)
        self.log = log
        self.flow = FlowControl(log) if flow_control else None
        self.faults = faults

    def settled(self, ack_ids):
        if self.flow:
            self.flow.settle(ack_ids)

    def modacked(self, ack_ids, seconds):
        if not self.flow:
            return
        for a, s in zip(ack_ids, seconds):
            if s == 0:
                self.flow.settle([a])
            else:
                self.flow.extend(a, s)

    def service(self, details):
        method = details.method
        if method.endswith("/StreamingPull"):
            return grpc.stream_stream_rpc_method_handler(
                lambda it, ctx: self.streaming_pull(method, it, ctx)
            )
        return grpc.unary_unary_rpc_method_handler(
            lambda req, ctx: self.unary(method, req, ctx)
        )

    def unary(self, method, req, ctx):
        name = method.rsplit("/", 1)[-1]
        fault = self.faults.take(name)
        if fault is not None:
            ctx.abort(fault, f"fault injected by the test proxy: {fault.name}")
        if name == "Acknowledge":
            r = PB["ack"].FromString(req)
            self.log.write("ack", ack_ids=list(r.ack_ids))
            self.settled(r.ack_ids)
        elif name == "ModifyAckDeadline":
            r = PB["modack"].FromString(req)
            self.log.write("modack", ack_ids=list(r.ack_ids), seconds=r.ack_deadline_seconds)
            self.modacked(r.ack_ids, [r.ack_deadline_seconds] * len(r.ack_ids))
        elif name == "Publish":
            r = PB["publish"].FromString(req)
            self.log.write("publish", topic=r.topic, count=len(r.messages))
        try:
            return self.channel.unary_unary(method)(req, timeout=timeout_of(ctx))
        except grpc.RpcError as e:
            ctx.abort(e.code(), e.details() or "")

    def streaming_pull(self, method, requests, ctx):
        log = self.log
        fault = self.faults.take("StreamingPull")
        if fault is not None:
            ctx.abort(fault, f"fault injected by the test proxy: {fault.name}")

        # The stream's first request: its client id and flow-control limits.
        first = []
        started = threading.Event()

        def forward():
            try:
                for b in requests:
                    r = PB["spreq"].FromString(b)
                    if not first:
                        first.append(r)
                        started.set()
                    if r.ack_ids:
                        log.write("ack", ack_ids=list(r.ack_ids))
                        self.settled(r.ack_ids)
                    if r.modify_deadline_ack_ids:
                        for a, s in zip(r.modify_deadline_ack_ids, r.modify_deadline_seconds):
                            log.write("modack", ack_ids=[a], seconds=s)
                        self.modacked(r.modify_deadline_ack_ids, r.modify_deadline_seconds)
                    yield b
            except grpc.RpcError:
                # The worker's side is gone (killed, cancelled): end the request half here, after
                # everything logged above, which the server then still gets.
                pass

        call = self.channel.stream_stream(method)(forward(), timeout=timeout_of(ctx))

        def worker_gone():
            # Not call.cancel() at once: a cancel can overtake requests logged but not yet sent
            # on (the server drops what it has not processed), and a logged ack must reach the
            # server. forward() half-closes, as a worker that stops does; the server finishes the
            # stream. Cancelled only if it has not within 10 s.
            t = threading.Timer(10, call.cancel)
            t.daemon = True
            t.start()

        ctx.add_callback(worker_gone)
        def deliver(rm):
            log.write(
                "deliver",
                ack_id=rm.ack_id,
                message_id=rm.message.message_id,
                attempt=rm.delivery_attempt,
                attributes=dict(rm.message.attributes),
            )

        def part(resp, messages):
            out = PB["spresp"]()
            out.CopyFrom(resp)
            del out.received_messages[:]
            out.received_messages.extend(messages)
            return out.SerializeToString()

        try:
            for b in call:
                resp = PB["spresp"].FromString(b)
                if not self.flow:
                    for rm in resp.received_messages:
                        deliver(rm)
                    yield b
                    continue
                # A response comes only after the first request went out.
                started.wait()
                ready = []
                for rm in resp.received_messages:
                    size = rm.message.ByteSize()
                    if not self.flow.admit(first[0], rm.ack_id, size, None):
                        # Past the limit: what fits goes now, the rest waits for room.
                        if ready:
                            for x in ready:
                                deliver(x)
                            yield part(resp, ready)
                            ready = []
                        if not self.flow.admit(first[0], rm.ack_id, size, ctx.is_active):
                            return
                    ready.append(rm)
                if ready:
                    for x in ready:
                        deliver(x)
                    yield part(resp, ready)
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                ctx.abort(e.code(), e.details() or "")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("port")
    p.add_argument("upstream")
    p.add_argument("log")
    p.add_argument("bucket", nargs="?")
    p.add_argument("--flow-control", action="store_true")
    a = p.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64), options=UNLIMITED)
    log = Log(a.log, a.bucket)
    server.add_generic_rpc_handlers((Proxy(a.upstream, log, a.flow_control, Faults(a.log)),))
    server.add_insecure_port(f"127.0.0.1:{a.port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
