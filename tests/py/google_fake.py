"""Google's side of credentials, on 127.0.0.1, for tests/credentials.rs.

One process serves:
* a token endpoint (`POST /token`): the JWT bearer grant of a service-account key — the RS256
  assertion verified with the key's public half (the `cryptography` module), and its header and
  claims checked: alg RS256, kid, iss, scope, aud = this token_uri, iat now, exp - iat <= 1 h — and
  the refresh-token grant of an `authorized_user` file (client id, secret, refresh token checked);
* a metadata server (`GET /computeMetadata/v1/instance/service-accounts/default/token`, with
  `Metadata-Flavor: Google` required, as Google's is);
* a Cloud Storage XML API for object_store (`/BUCKET/OBJECT`: single PUT with
  `x-goog-if-generation-match: 0`, multipart initiate / part / complete / abort, GET, HEAD,
  DELETE, and `GET /BUCKET?list-type=2` listing); objects land in GCS_DIR/BUCKET;
* a forwarding proxy of BigQuery's REST API (`/bigquery/v2/...`) to the BigQuery emulator;
* on a second port, a gRPC proxy forwarding `google.pubsub.v1.*` to the Pub/Sub emulator and
  `google.cloud.bigquery.storage.v1.*` to the BigQuery emulator's Storage Write API.

Every request to a Google API (GCS, BigQuery REST, gRPC) must carry `Authorization: Bearer T`
with T a token this server issued and that has not expired; otherwise it is refused (HTTP 401,
gRPC UNAUTHENTICATED), as Google refuses it, and logged as such.

usage: google_fake.py DIR [--lifetime S] [--refuse] [--fail-after N] [--pubsub HOST:PORT]
                          [--bq-rest URL] [--bq-grpc HOST:PORT] [--gcs-dir DIR]

--refuse: every grant is refused (400 invalid_grant); --fail-after N: after N tokens, the token
endpoint answers 503.

Writes into DIR: `sa.json` (a fresh service-account key whose token_uri is this server),
`user.json` (an authorized_user file, token_uri this server), `log.jsonl` (one JSON object a line),
and prints `ready {"http": PORT, "grpc": PORT}` on stdout once both ports listen.

Log events ("t" is time.time()):
  {"ev": "grant", "kind": "jwt"|"refresh"|"metadata", "ok": bool, "reason"?, "header"?, "claims"?,
   "token"?, "expires_in"?}
  {"ev": "call", "api": "gcs"|"bq-rest"|"grpc", "method", "auth": "ok"|"missing"|"unknown"|"expired",
   "kind"? (the grant that issued the token), "remaining"? (seconds the token had left)}
"""

import argparse
import base64
import hashlib
import http.server
import json
import os
import re
import secrets
import socketserver
import sys
import threading
import time
import urllib.parse
import urllib.request
import urllib.error
from concurrent import futures

import grpc
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.exceptions import InvalidSignature

SCOPE = "https://www.googleapis.com/auth/cloud-platform"
JWT_GRANT = "urn:ietf:params:oauth:grant-type:jwt-bearer"
UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class State:
    def __init__(self, args, dir_):
        self.args = args
        self.lock = threading.Lock()
        self.log_f = open(os.path.join(dir_, "log.jsonl"), "a", buffering=1)
        self.tokens = {}  # token -> (expires_at, kind)
        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.key_id = secrets.token_hex(8)
        self.email = "subsink-test@fake-project.iam.gserviceaccount.com"
        self.client_id = "fake-client-" + secrets.token_hex(4)
        self.client_secret = "fake-secret-" + secrets.token_hex(8)
        self.refresh_token = "fake-refresh-" + secrets.token_hex(8)
        self.uploads = {}  # upload id -> {part number: bytes}
        self.generation = 0

    def log(self, ev, **kw):
        kw["ev"] = ev
        kw["t"] = time.time()
        with self.lock:
            self.log_f.write(json.dumps(kw) + "\n")

    def issue(self, kind):
        token = "ya29.fake-" + kind + "-" + secrets.token_urlsafe(24)
        lifetime = self.args.lifetime
        with self.lock:
            self.tokens[token] = (time.time() + lifetime, kind)
        return token, lifetime

    def check(self, header):
        """(verdict, kind, seconds left) of an Authorization header."""
        if not header or not header.startswith("Bearer "):
            return "missing", None, None
        token = header[len("Bearer "):]
        with self.lock:
            entry = self.tokens.get(token)
        if entry is None:
            return "unknown", None, None
        expires_at, kind = entry
        left = expires_at - time.time()
        return ("ok" if left > 0 else "expired"), kind, round(left, 3)


def b64d(s):
    return base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))


def verify_assertion(state, assertion, token_uri):
    """The JWT's header and claims, or raise ValueError saying what is wrong."""
    parts = assertion.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT (three dot-separated parts)")
    header = json.loads(b64d(parts[0]))
    claims = json.loads(b64d(parts[1]))
    if header.get("alg") != "RS256":
        raise ValueError(f"alg {header.get('alg')!r}, expected RS256")
    if header.get("kid") != state.key_id:
        raise ValueError(f"kid {header.get('kid')!r}, expected the key's id")
    try:
        state.key.public_key().verify(
            b64d(parts[2]),
            (parts[0] + "." + parts[1]).encode(),
            padding.PKCS1v15(),
            hashes.SHA256(),
        )
    except InvalidSignature:
        raise ValueError("the RS256 signature does not verify with the key's public half")
    now = time.time()
    if claims.get("iss") != state.email:
        raise ValueError(f"iss {claims.get('iss')!r}, expected {state.email}")
    if claims.get("scope") != SCOPE:
        raise ValueError(f"scope {claims.get('scope')!r}, expected {SCOPE}")
    if claims.get("aud") != token_uri:
        raise ValueError(f"aud {claims.get('aud')!r}, expected {token_uri}")
    iat, exp = claims.get("iat"), claims.get("exp")
    if not isinstance(iat, int) or not isinstance(exp, int):
        raise ValueError("iat and exp must be integers")
    if abs(iat - now) > 60:
        raise ValueError(f"iat {iat} is not now ({int(now)})")
    if not (now < exp and exp - iat <= 3600):
        raise ValueError(f"lifetime exp - iat = {exp - iat} s: must be at most 3600 and not past")
    return header, claims


class Http(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state = None
    port = None

    def log_message(self, *a):
        pass

    def body(self):
        """The request body, read once (route() reads it first, so a refused request leaves
        nothing unread on a kept-alive connection)."""
        if getattr(self, "_body", None) is None:
            n = int(self.headers.get("Content-Length") or 0)
            self._body = self.rfile.read(n) if n else b""
        return self._body

    def reply(self, code, body=b"", headers=None, ctype="application/json"):
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(body)))
        if body:
            self.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if body and self.command != "HEAD":
            self.wfile.write(body)

    # ---- token endpoint and metadata server

    def token(self):
        st = self.state
        form = urllib.parse.parse_qs(self.body().decode())
        one = lambda k: (form.get(k) or [""])[0]
        grant = one("grant_type")
        token_uri = f"http://127.0.0.1:{self.port}/token"
        kind = {"refresh_token": "refresh", JWT_GRANT: "jwt"}.get(grant)
        if kind is None:
            st.log("grant", kind=grant, ok=False, reason="unsupported grant_type")
            return self.reply(400, {"error": "unsupported_grant_type"})
        extra = {}
        with st.lock:
            granted = sum(1 for _, k in st.tokens.values() if k != "metadata")
        if st.args.fail_after is not None and granted >= st.args.fail_after:
            st.log("grant", kind=kind, ok=False, reason="unavailable (--fail-after)")
            return self.reply(503, {"error": "backend_error"})
        try:
            if st.args.refuse:
                raise ValueError("Token has been expired or revoked.")
            if kind == "jwt":
                header, claims = verify_assertion(st, one("assertion"), token_uri)
                extra = {"header": header, "claims": claims}
            else:
                if one("client_id") != st.client_id or one("client_secret") != st.client_secret:
                    raise ValueError("wrong client id or secret")
                if one("refresh_token") != st.refresh_token:
                    raise ValueError("wrong refresh token")
        except (ValueError, KeyError, json.JSONDecodeError) as e:
            st.log("grant", kind=kind, ok=False, reason=str(e), **extra)
            return self.reply(400, {"error": "invalid_grant", "error_description": str(e)})
        token, lifetime = st.issue(kind)
        st.log("grant", kind=kind, ok=True, token=token, expires_in=lifetime, **extra)
        self.reply(200, {"access_token": token, "expires_in": lifetime, "token_type": "Bearer"})

    def metadata(self):
        st = self.state
        if self.headers.get("Metadata-Flavor") != "Google":
            st.log("grant", kind="metadata", ok=False, reason="no Metadata-Flavor: Google")
            return self.reply(403, b"Missing Metadata-Flavor:Google header.", ctype="text/plain")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        token, lifetime = st.issue("metadata")
        st.log("grant", kind="metadata", ok=True, token=token, expires_in=lifetime,
               scopes=(query.get("scopes") or [""])[0])
        self.reply(200, {"access_token": token, "expires_in": lifetime, "token_type": "Bearer"})

    # ---- Google APIs: the token is checked first

    def authorized(self, api, method):
        verdict, kind, left = self.state.check(self.headers.get("Authorization"))
        self.state.log("call", api=api, method=method, auth=verdict, kind=kind, remaining=left)
        if verdict != "ok":
            self.reply(401, {"error": {"code": 401, "message": f"credentials {verdict}",
                                       "status": "UNAUTHENTICATED"}})
            return False
        return True

    def route(self):
        self._body = None
        self.body()
        path = urllib.parse.urlsplit(self.path).path
        if path == "/token" and self.command == "POST":
            return self.token()
        if path.startswith("/computeMetadata/v1/instance/service-accounts/default/token"):
            return self.metadata()
        if path.startswith("/bigquery/"):
            if self.authorized("bq-rest", f"{self.command} {path}"):
                self.forward_bq()
            return
        if self.state.args.gcs_dir:
            return self.gcs(path)
        self.reply(404, {"error": "not found"})

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = route

    def forward_bq(self):
        body = self.body()
        req = urllib.request.Request(self.state.args.bq_rest + self.path, data=body or None,
                                     method=self.command)
        for k in ("Content-Type",):
            if self.headers.get(k):
                req.add_header(k, self.headers[k])
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                code, data, ctype = r.status, r.read(), r.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            code, data, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        self.reply(code, data, ctype=ctype or "application/json")

    # ---- Cloud Storage, XML API (what object_store sends)

    def gcs(self, path):
        q = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query, keep_blank_values=True)
        one = lambda k: (q.get(k) or [None])[0]
        op = self.command
        if op == "POST" and "uploads" in q:
            op = "INITIATE"
        elif op == "PUT" and one("uploadId"):
            op = "PART"
        elif op == "POST" and one("uploadId"):
            op = "COMPLETE"
        elif op == "DELETE" and one("uploadId"):
            op = "ABORT"
        bucket, _, name = path.lstrip("/").partition("/")
        name = urllib.parse.unquote(name)
        if op == "GET" and not name and one("list-type") == "2":
            op = "LIST"
        if not self.authorized("gcs", op):
            return
        if op == "LIST":
            return self.list(bucket, one("prefix") or "", one("delimiter"), one("start-after"))
        if not bucket or not name or ".." in name.split("/"):
            return self.reply(400, {"error": "bad object path"})
        file = os.path.join(self.state.args.gcs_dir, bucket, name)
        st = self.state
        if op == "PUT":
            data = self.body()
            if self.headers.get("x-goog-if-generation-match") == "0" and os.path.exists(file):
                return self.reply(412, b"<Error><Code>PreconditionFailed</Code></Error>",
                                  ctype="application/xml")
            return self.store(file, data)
        if op == "INITIATE":
            self.body()
            uid = secrets.token_hex(8)
            with st.lock:
                st.uploads[uid] = {}
            xml = (f"<InitiateMultipartUploadResult><Bucket>{bucket}</Bucket><Key>{name}</Key>"
                   f"<UploadId>{uid}</UploadId></InitiateMultipartUploadResult>")
            return self.reply(200, xml.encode(), ctype="application/xml")
        if op == "PART":
            data = self.body()
            with st.lock:
                parts = st.uploads.get(one("uploadId"))
                if parts is None:
                    return self.reply(404, b"<Error><Code>NoSuchUpload</Code></Error>")
                parts[int(one("partNumber"))] = data
            return self.reply(200, headers={"ETag": '"' + hashlib.md5(data).hexdigest() + '"'})
        if op == "COMPLETE":
            xml = self.body().decode()
            numbers = [int(n) for n in re.findall(r"<PartNumber>(\d+)</PartNumber>", xml)]
            with st.lock:
                parts = st.uploads.pop(one("uploadId"), None)
            if parts is None or any(n not in parts for n in numbers):
                return self.reply(400, b"<Error><Code>InvalidPart</Code></Error>")
            data = b"".join(parts[n] for n in numbers)
            etag = self.write_object(file, data)
            xml = (f"<CompleteMultipartUploadResult><Location>/{bucket}/{name}</Location>"
                   f"<Bucket>{bucket}</Bucket><Key>{name}</Key><ETag>{etag}</ETag>"
                   "</CompleteMultipartUploadResult>")
            return self.reply(200, xml.encode(), ctype="application/xml")
        if op == "ABORT":
            with st.lock:
                st.uploads.pop(one("uploadId"), None)
            return self.reply(204)
        if op in ("GET", "HEAD"):
            if not os.path.isfile(file):
                return self.reply(404, b"<Error><Code>NoSuchKey</Code></Error>",
                                  ctype="application/xml")
            data = open(file, "rb").read()
            mtime = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(os.path.getmtime(file)))
            headers = {"ETag": '"' + hashlib.md5(data).hexdigest() + '"',
                       "Last-Modified": mtime}
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range") or "")
            if m and data:
                first = int(m.group(1))
                last = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                headers["Content-Range"] = f"bytes {first}-{last}/{len(data)}"
                return self.reply(206, data[first:last + 1], ctype="application/octet-stream",
                                  headers=headers)
            return self.reply(200, data, ctype="application/octet-stream", headers=headers)
        if op == "DELETE":
            if os.path.isfile(file):
                os.remove(file)
            return self.reply(204)
        self.reply(405, b"")

    def list(self, bucket, prefix, delimiter, start_after):
        """ListObjectsV2 as GCS's XML API answers it: every object (one page), or with a
        delimiter the objects and common prefixes at that level."""
        root = os.path.join(self.state.args.gcs_dir, bucket)
        keys = []
        for d, _, files in os.walk(root):
            for f in files:
                if ".tmp-" in f:
                    continue
                key = os.path.relpath(os.path.join(d, f), root)
                if key.startswith(prefix) and (not start_after or key > start_after):
                    keys.append(key)
        contents, prefixes = [], set()
        for key in sorted(keys):
            rest = key[len(prefix):]
            if delimiter and delimiter in rest:
                prefixes.add(prefix + rest.split(delimiter)[0] + delimiter)
                continue
            file = os.path.join(root, key)
            data = open(file, "rb").read()
            mtime = time.strftime("%Y-%m-%dT%H:%M:%S.000Z", time.gmtime(os.path.getmtime(file)))
            contents.append(f"<Contents><Key>{key}</Key><LastModified>{mtime}</LastModified>"
                            f"<ETag>\"{hashlib.md5(data).hexdigest()}\"</ETag>"
                            f"<Size>{len(data)}</Size></Contents>")
        xml = ("<?xml version='1.0' encoding='UTF-8'?><ListBucketResult>"
               f"<Name>{bucket}</Name><Prefix>{prefix}</Prefix><KeyCount>{len(contents)}</KeyCount>"
               + "".join(contents)
               + "".join(f"<CommonPrefixes><Prefix>{p}</Prefix></CommonPrefixes>"
                         for p in sorted(prefixes))
               + "<IsTruncated>false</IsTruncated></ListBucketResult>")
        self.reply(200, xml.encode(), ctype="application/xml")

    def write_object(self, file, data):
        os.makedirs(os.path.dirname(file), exist_ok=True)
        tmp = file + ".tmp-" + secrets.token_hex(4)
        with open(tmp, "wb") as f:
            f.write(data)
        os.rename(tmp, file)
        return '"' + hashlib.md5(data).hexdigest() + '"'

    def store(self, file, data):
        etag = self.write_object(file, data)
        with self.state.lock:
            self.state.generation += 1
            gen = str(self.state.generation)
        self.reply(200, headers={"ETag": etag, "x-goog-generation": gen})


class ThreadingHttp(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True


# ---- gRPC: Pub/Sub and BigQuery Storage Write, forwarded after the token is checked

STREAMING = ("/google.pubsub.v1.Subscriber/StreamingPull",
             "/google.cloud.bigquery.storage.v1.BigQueryWrite/AppendRows")


def timeout_of(ctx):
    t = ctx.time_remaining()
    return t if t is not None and t < 86400 else None


class GrpcProxy(grpc.GenericRpcHandler):
    def __init__(self, state):
        self.state = state
        a = state.args
        self.channels = {}
        if a.pubsub:
            self.channels["google.pubsub.v1."] = grpc.insecure_channel(a.pubsub, options=UNLIMITED)
        if a.bq_grpc:
            self.channels["google.cloud.bigquery.storage.v1."] = grpc.insecure_channel(
                a.bq_grpc, options=UNLIMITED)

    def channel(self, method):
        for prefix, ch in self.channels.items():
            if method.startswith("/" + prefix):
                return ch
        return None

    def check(self, method, ctx):
        md = dict(ctx.invocation_metadata())
        verdict, kind, left = self.state.check(md.get("authorization"))
        self.state.log("call", api="grpc", method=method, auth=verdict, kind=kind, remaining=left)
        if verdict != "ok":
            ctx.abort(grpc.StatusCode.UNAUTHENTICATED, f"credentials {verdict}")
        return [(k, v) for k, v in md.items() if k == "x-goog-request-params"]

    def service(self, details):
        method = details.method
        ch = self.channel(method)
        if ch is None:
            return None
        if method in STREAMING:
            return grpc.stream_stream_rpc_method_handler(
                lambda it, ctx: self.stream(ch, method, it, ctx))
        return grpc.unary_unary_rpc_method_handler(lambda req, ctx: self.unary(ch, method, req, ctx))

    def unary(self, ch, method, req, ctx):
        md = self.check(method, ctx)
        try:
            return ch.unary_unary(method)(req, timeout=timeout_of(ctx), metadata=md)
        except grpc.RpcError as e:
            ctx.abort(e.code(), e.details() or "")

    def stream(self, ch, method, requests, ctx):
        md = self.check(method, ctx)

        def forward():
            try:
                for b in requests:
                    yield b
            except grpc.RpcError:
                pass

        call = ch.stream_stream(method)(forward(), timeout=timeout_of(ctx), metadata=md)
        ctx.add_callback(lambda: threading.Timer(10, call.cancel).start())
        try:
            for b in call:
                yield b
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.CANCELLED:
                ctx.abort(e.code(), e.details() or "")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--lifetime", type=int, default=3600)
    p.add_argument("--refuse", action="store_true")
    p.add_argument("--fail-after", type=int)
    p.add_argument("--pubsub")
    p.add_argument("--bq-rest")
    p.add_argument("--bq-grpc")
    p.add_argument("--gcs-dir")
    args = p.parse_args()
    state = State(args, args.dir)

    Http.state = state
    httpd = ThreadingHttp(("127.0.0.1", 0), Http)
    Http.port = httpd.server_address[1]
    token_uri = f"http://127.0.0.1:{Http.port}/token"
    pem = state.key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()).decode()
    with open(os.path.join(args.dir, "sa.json"), "w") as f:
        json.dump({"type": "service_account", "project_id": "fake-project",
                   "private_key_id": state.key_id, "private_key": pem,
                   "client_email": state.email, "client_id": "1234567890",
                   "token_uri": token_uri}, f)
    with open(os.path.join(args.dir, "user.json"), "w") as f:
        json.dump({"type": "authorized_user", "client_id": state.client_id,
                   "client_secret": state.client_secret, "refresh_token": state.refresh_token,
                   "token_uri": token_uri}, f)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=32), options=UNLIMITED)
    server.add_generic_rpc_handlers((GrpcProxy(state),))
    grpc_port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print("ready " + json.dumps({"http": Http.port, "grpc": grpc_port}), flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main()
