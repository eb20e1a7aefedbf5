"""An HTTP proxy in front of an S3 server (moto) that records object writes and can fail them.

A test needs a store that fails or hangs on demand, and the moment each object became visible
(measured here, not reported by the writer). Requests are passed to the S3 server unchanged,
except writes (PUT, POST) while the control file says otherwise (and reads when it says so).

usage: s3_proxy.py LISTEN_PORT UPSTREAM_PORT CONTROL LOG

CONTROL is a JSON file read on every request (a missing file means "pass"):
  {"mode": "pass"}             pass every request
  {"mode": "deny"}             answer every write 403 AccessDenied
  {"mode": "unavailable"}      answer every write 503 ServiceUnavailable (a transient failure)
  {"mode": "hang"}             never answer a write (the connection stays open)
  {"mode": "error"}            answer every write 500 InternalError (a store that fails, retryably)
  {"mode": ..., "key": S}      the mode applies only to writes whose key contains S (others pass)
  {"mode": "hold"}             hold every write until the rule is no longer "hold", then go on
                               under the new rule (logged with status "hold" when held)
  {"mode": "hold", "reads": true, "key": S}
                               hold every read (GET) of a key containing S instead, until the
                               rule changes (writes pass); logged with kind "get", status "hold"
  {"deny_object": N}           pass, but answer 403 to every write of the N-th distinct object key
                               written through the proxy (1-based), for as long as the proxy runs
LOG gets one JSON line per write: {"t": time.monotonic(), "method", "key", "kind", "status"};
kind is "put" (a single put), "create" (multipart start), "part", "complete" (multipart end) or
"abort". An object is visible from the "put" or "complete" line with status 200 on.
Prints "ready" on stdout once it listens.
"""

import http.client
import json
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "upgrade"}


class State:
    def __init__(self, upstream, control, log):
        self.upstream = upstream
        self.control = control
        self.log = open(log, "a", buffering=1)
        self.lock = threading.Lock()
        self.keys = []

    def rule(self):
        try:
            with open(self.control) as f:
                return json.load(f)
        except (FileNotFoundError, json.JSONDecodeError):
            return {"mode": "pass"}

    def nth(self, key):
        with self.lock:
            if key not in self.keys:
                self.keys.append(key)
            return self.keys.index(key) + 1

    def record(self, **kw):
        kw["t"] = time.monotonic()
        with self.lock:
            self.log.write(json.dumps(kw) + "\n")


def kind_of(method, query):
    q = urllib.parse.parse_qs(query, keep_blank_values=True)
    if method == "PUT":
        return "part" if "partNumber" in q else "put"
    if method == "POST":
        if "uploads" in q:
            return "create"
        if "uploadId" in q:
            return "complete"
        return "post"
    if method == "DELETE" and "uploadId" in q:
        return "abort"
    return None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None

    def log_message(self, *args):
        pass

    def _relay(self):
        st = self.state
        url = urllib.parse.urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        kind = kind_of(self.command, url.query)
        key = urllib.parse.unquote(url.path)
        if self.command == "GET":
            rule = st.rule()
            if rule.get("reads") and rule.get("mode") == "hold" and rule.get("key", "") in key:
                st.record(method=self.command, key=key, kind="get", status="hold")
                while rule.get("reads") and rule.get("mode") == "hold":
                    time.sleep(0.05)
                    rule = st.rule()
        if kind in ("put", "create", "part", "complete"):
            rule = st.rule()
            n = st.nth(key)
            if "key" in rule and rule["key"] not in key:
                rule = {"mode": "pass"}
            if rule.get("mode") == "error":
                st.record(method=self.command, key=key, kind=kind, status=500)
                msg = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InternalError</Code><Message>failed by the test proxy</Message></Error>"
                self.send_response(500)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            if rule.get("mode") == "hold":
                st.record(method=self.command, key=key, kind=kind, status="hold")
                while rule.get("mode") == "hold":
                    time.sleep(0.05)
                    rule = st.rule()
            if rule.get("mode") == "hang":
                st.record(method=self.command, key=key, kind=kind, status="hang")
                time.sleep(3600)
                return
            if rule.get("mode") == "unavailable":
                st.record(method=self.command, key=key, kind=kind, status=503)
                msg = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>ServiceUnavailable</Code><Message>unavailable by the test proxy</Message></Error>"
                self.send_response(503)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
            if rule.get("mode") == "deny" or rule.get("deny_object") == n:
                st.record(method=self.command, key=key, kind=kind, status=403)
                msg = b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>AccessDenied</Code><Message>denied by the test proxy</Message></Error>"
                self.send_response(403)
                self.send_header("Content-Type", "application/xml")
                self.send_header("Content-Length", str(len(msg)))
                self.end_headers()
                self.wfile.write(msg)
                return
        conn = http.client.HTTPConnection("127.0.0.1", st.upstream, timeout=120)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        conn.request(self.command, self.path, body=body, headers=headers)
        resp = conn.getresponse()
        data = resp.read()
        if kind:
            st.record(method=self.command, key=key, kind=kind, status=resp.status)
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in HOP and k.lower() != "content-length":
                self.send_header(k, v)
        if self.command == "HEAD":
            self.send_header("Content-Length", resp.getheader("Content-Length") or "0")
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _relay


def main():
    port, upstream, control, log = sys.argv[1:5]
    Handler.state = State(int(upstream), control, log)
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), Handler)
    server.daemon_threads = True
    print("ready", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
