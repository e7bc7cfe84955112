"""A loopback HTTPS proxy through which TensorFlow's own gs:// client reaches fake-gcs-server.

TensorFlow's GCS file system (C++, libcurl) has Google's endpoints compiled in
(www.googleapis.com for metadata, listings and uploads, storage.googleapis.com for
reads) and no setting to change them; it does honour `https_proxy` and
`CURL_CA_BUNDLE`. So this proxy accepts CONNECT to those hosts only, terminates
TLS with a throwaway CA (certs.py), and sends each request over plain HTTP to the
emulator, the only address it ever connects to. Clients of the emulator's own
protocol (gcsfs, through `STORAGE_EMULATOR_HOST`) come here too, unencrypted, so
that every storage request of a test is logged and can be faulted.

It runs in a process of its own (`python -m fake_gcs`, see __main__.py), never in
the process that uses TensorFlow: some of TensorFlow's Python bindings hold the
GIL while they do gs:// I/O (`tf.train.Checkpoint.restore` does, in
CheckpointReader), and a proxy thread in that process would wait for the GIL
while TensorFlow waits for the proxy. The test process talks to it through a
small control API (`/_fake_gcs/...` on its plain address): fault rules in, the
request log out.

Why a proxy of our own and not mitmproxy 11 with an addon: mitmproxy refuses
TensorFlow's resumable-upload PUTs by default (they carry both Content-Length and
chunked framing), cannot close a connection part-way through a request body
(the mid-upload fault) without its unfinished request streaming, and brings ~30
pinned packages (an older `cryptography` among them) into the test environment,
for what is one client's HTTP/1.1 over TLS: some 300 lines of standard library.

What the proxy changes on the way, each a difference between the emulator and GCS:
- `GET /storage/v1/b/<bucket>/storageLayout` is answered here (GCS answers it, the
  emulator says 404, and TensorFlow then fails every directory rename).
- Reads `storage.googleapis.com/<bucket>/<object>` name the object with its
  slashes escaped (%2F); the emulator finds it only with raw slashes.
- libcurl sends `Expect: 100-continue` (answered at once: unanswered, every upload
  waits a second) and resumable-upload PUTs with chunked framing, which the
  emulator rejects (501 Unsupported transfer encoding): bodies go on de-chunked.
- The upload session `Location` the emulator gives names the emulator itself: it
  is given back as the address the client came by (www.googleapis.com through a
  tunnel), or the client would upload past the proxy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import json
import socket
import socketserver
import ssl
import time
import urllib.parse

from fake_gcs.traffic import DOWNLOAD_HOST, FaultRule, Request, Traffic, classify

API_HOST = "www.googleapis.com"
TUNNEL_HOSTS = frozenset({API_HOST, DOWNLOAD_HOST, "oauth2.googleapis.com"})
LOCATION = "US-CENTRAL1"  # the emulator's default bucket location
CONTROL = "/_fake_gcs/"  # the control API's paths, on the plain address only

# Headers that describe one hop (or that the proxy sets itself): never passed on.
_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
        "host",
    }
)
_MAX_LINE = 65536
_FORBIDDEN = b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class StorageProxy(socketserver.ThreadingTCPServer):
    """Listens on a free port of 127.0.0.1; passes storage requests to the emulator's port."""

    daemon_threads = True

    def __init__(self, *, ssl_context: ssl.SSLContext, emulator_port: int, timeout: float = 60):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ssl_context, self.emulator_port, self.timeout = ssl_context, emulator_port, timeout
        self.port: int = self.server_address[1]
        self.origin = f"http://127.0.0.1:{self.port}"
        self.traffic = Traffic()


class _Dropped(Exception):
    """The connection is gone: a fault closed it, or the client went away mid-request."""


class _Handler(socketserver.BaseRequestHandler):
    server: StorageProxy

    def handle(self) -> None:
        proxy = self.server
        sock: socket.socket = self.request
        sock.settimeout(proxy.timeout)
        # Small writes go out at once: with Nagle's algorithm each request waited for
        # the client's delayed ACK, ~45 ms a request from TensorFlow (~5 ms without).
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # Unbuffered: after a CONNECT the same socket carries TLS, and a buffered
        # reader could have swallowed the start of the handshake.
        first = _read_head(sock.makefile("rb", buffering=0))
        if first is None:
            return
        method, target, headers = first
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            if host not in TUNNEL_HOSTS or port != "443":
                _refuse(proxy, method, target)
                sock.sendall(_FORBIDDEN)
                return
            sock.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
            try:
                sock = proxy.ssl_context.wrap_socket(sock, server_side=True)
            except (ssl.SSLError, OSError):
                return  # a client that does not trust the CA, or went away
            _Connection(proxy, sock, host=host, origin=f"https://{host}").serve()
        elif target.startswith("/"):
            # The emulator's own protocol (gcsfs), or the control API: no TLS.
            _Connection(proxy, sock, host=headers.get("Host", ""), origin=proxy.origin).serve(first)
        else:  # a plain-HTTP proxy request, to some other server
            _refuse(proxy, method, target)
            sock.sendall(_FORBIDDEN)


def _refuse(proxy: StorageProxy, method: str, target: str) -> None:
    proxy.traffic.record(Request(method, target, "", "refused", "", "", 403, time.time()))


def _read_head(reader) -> tuple[str, str, http.client.HTTPMessage] | None:
    """(method, target, headers) of the next request; None if the client closed."""
    try:
        parts = reader.readline(_MAX_LINE).decode("latin-1").split()
    except (OSError, ssl.SSLError):
        return None
    if len(parts) != 3:
        return None
    method, target, _version = parts
    return method, target, http.client.parse_headers(reader)


@dataclasses.dataclass
class _Answer:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


def _json(status: int, value: object) -> _Answer:
    return _Answer(status, [("Content-Type", "application/json")], json.dumps(value).encode())


def _error(status: int, message: str) -> _Answer:
    return _json(status, {"error": {"code": status, "message": message}})


class _Connection:
    """One client connection: its requests in order, each logged, faulted or passed on."""

    def __init__(self, proxy: StorageProxy, sock: socket.socket, *, host: str, origin: str):
        self.proxy, self.sock, self.host, self.origin = proxy, sock, host, origin
        self.reader = sock.makefile("rb")

    def serve(self, first: tuple[str, str, http.client.HTTPMessage] | None = None) -> None:
        head = first or _read_head(self.reader)
        with contextlib.suppress(_Dropped, OSError, ssl.SSLError):
            while head is not None and self._serve_one(*head):
                head = _read_head(self.reader)
        with contextlib.suppress(OSError):
            self.sock.close()

    def _serve_one(self, method: str, target: str, headers: http.client.HTTPMessage) -> bool:
        """Answers one request; False when the connection is to be closed."""
        if self.origin == self.proxy.origin and target.startswith(CONTROL):
            body = self._read_body(headers)
            self._send(_control(self.proxy.traffic, method, target, body), close=False)
            return True
        start, started = time.time(), time.monotonic()
        request = Request(method, self.host, target, *classify(method, self.host, target))
        rule = self.proxy.traffic.rule_for(request)

        def log(status: int | None, body_bytes: int = 0) -> None:
            self.proxy.traffic.record(
                dataclasses.replace(
                    request,
                    status=status,
                    time=start,
                    seconds=time.monotonic() - started,
                    fault=rule is not None,
                    body_bytes=body_bytes,
                )
            )

        if rule is not None:
            time.sleep(rule.delay)
        if rule is not None and rule.status is not None:
            # Answered before the body is read, as GCS answers a refused request; the
            # connection is closed after, so that an unread body is not taken for a request.
            log(rule.status)  # before the answer: a client that has it finds it logged
            self._send(_error(rule.status, "fault injected by the test"), close=True)
            return False
        if headers.get("Expect", "").lower() == "100-continue":
            self.sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        if rule is not None and rule.drop_after is not None:
            self._read_body(headers, limit=rule.drop_after)
            log(None)
            with contextlib.suppress(OSError):
                self.sock.shutdown(socket.SHUT_RDWR)
            raise _Dropped
        body = self._read_body(headers)
        answer = self._answer(request, method, target, headers, body)
        close = headers.get("Connection", "").lower() == "close"
        # Logged before it is answered: once its client has the answer, the request is in
        # the log (`GcsServer.counting` ends when the client's last call returned).
        log(answer.status, len(body))
        self._send(answer, close=close)
        return not close

    def _answer(
        self,
        request: Request,
        method: str,
        target: str,
        headers: http.client.HTTPMessage,
        body: bytes,
    ) -> _Answer:
        path = target.partition("?")[0]
        if request.kind == "auth":
            # Asked only if GOOGLE_AUTH_TOKEN_FOR_TESTING is missing: a token, never Google's.
            return _json(200, {"access_token": "fake", "expires_in": 3600, "token_type": "Bearer"})
        if request.kind == "other" and not path.startswith(
            ("/storage/v1/", "/upload/storage/v1/", "/download/storage/v1/")
        ):
            return _error(403, f"the test proxy passes on storage requests only, not {path}")
        if method == "GET" and path == f"/storage/v1/b/{request.bucket}/storageLayout":
            return self._storage_layout(request.bucket)
        if self.host == DOWNLOAD_HOST and request.kind == "download":
            # /<bucket>/<a%2Fb> -> /<bucket>/<a/b>: the emulator splits the path on raw slashes.
            bucket, _, escaped = path[1:].partition("/")
            target = f"/{bucket}/{escaped.replace('%2F', '/').replace('%2f', '/')}"
        return self._forward(method, target, headers, body)

    def _storage_layout(self, bucket: str) -> _Answer:
        """What GCS answers for a bucket with a flat namespace (no hierarchical namespace)."""
        exists = self._forward("GET", f"/storage/v1/b/{bucket}", http.client.HTTPMessage(), b"")
        if exists.status != 200:
            return exists
        return _json(
            200,
            {
                "kind": "storage#storageLayout",
                "bucket": bucket,
                "location": LOCATION,
                "locationType": "region",
                "hierarchicalNamespace": {"enabled": False},
            },
        )

    def _forward(
        self, method: str, target: str, headers: http.client.HTTPMessage, body: bytes
    ) -> _Answer:
        emulator = f"127.0.0.1:{self.proxy.emulator_port}"
        # A new connection per request: loopback connects cost microseconds, and an
        # idle keep-alive that the emulator closed cannot break a request.
        upstream = http.client.HTTPConnection(emulator, timeout=self.proxy.timeout)
        try:
            upstream.putrequest(method, target, skip_host=True, skip_accept_encoding=True)
            # Reads by /<bucket>/<object> are routed for the emulator's -public-host only.
            upstream.putheader("Host", emulator)
            for name, value in headers.items():
                if name.lower() not in _HOP_HEADERS:
                    upstream.putheader(name, value)
            if body or method in ("POST", "PUT", "PATCH"):
                upstream.putheader("Content-Length", str(len(body)))
            upstream.endheaders(body or None)
            response = upstream.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as e:
            return _error(502, f"the emulator did not answer: {e!r}")
        finally:
            upstream.close()
        answer_headers = [
            (
                name,
                value.replace(f"http://{emulator}", self.origin) if name == "Location" else value,
            )
            for name, value in response.getheaders()
            if name.lower() not in _HOP_HEADERS
        ]
        return _Answer(response.status, answer_headers, data)

    def _read_body(self, headers: http.client.HTTPMessage, limit: int | None = None) -> bytes:
        """The request body, de-chunked; with `limit`, only its first `limit` bytes."""
        if "chunked" not in headers.get("Transfer-Encoding", "").lower():
            length = int(headers.get("Content-Length") or 0)
            return self._read_exactly(length if limit is None else min(length, limit))
        chunks, size = [], 0
        while limit is None or size < limit:
            length = int(self.reader.readline(_MAX_LINE).split(b";")[0], 16)
            if length == 0:
                while self.reader.readline(_MAX_LINE).strip():  # trailers, to a blank line
                    pass
                break
            wanted = length if limit is None else min(length, limit - size)
            chunks.append(self._read_exactly(wanted))
            size += wanted
            if wanted == length:
                self.reader.readline(_MAX_LINE)  # the CRLF that ends a chunk
        return b"".join(chunks)

    def _read_exactly(self, n: int) -> bytes:
        data = self.reader.read(n)
        if len(data) < n:
            raise _Dropped
        return data

    def _send(self, answer: _Answer, *, close: bool) -> None:
        reason = http.client.responses.get(answer.status, "")
        lines = [f"HTTP/1.1 {answer.status} {reason}", *(f"{n}: {v}" for n, v in answer.headers)]
        if answer.status not in (204, 304):
            lines.append(f"Content-Length: {len(answer.body)}")
        if close:
            lines.append("Connection: close")
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + answer.body)


def _control(traffic: Traffic, method: str, target: str, body: bytes) -> _Answer:
    """The control API: fault rules in, the request log out (server.py is its client).

    POST   /_fake_gcs/rules         a FaultRule's fields as JSON -> {"id": n}
    GET    /_fake_gcs/rules/<n>     -> {"seen": ..., "hits": ...}
    DELETE /_fake_gcs/rules         removes every rule
    GET    /_fake_gcs/requests?since=<i>  -> {"requests": [the i-th logged on]}
    GET    /_fake_gcs/requests/total      -> {"total": how many were logged}
    """
    split = urllib.parse.urlsplit(target)
    route = split.path[len(CONTROL) :]
    if method == "POST" and route == "rules":
        return _json(200, {"id": traffic.add_rule(FaultRule(**json.loads(body)))})
    if method == "GET" and route.startswith("rules/"):
        rule = traffic.rule(int(route.removeprefix("rules/")))
        if rule is None:
            return _error(404, f"no rule {route}")
        return _json(200, {"seen": rule.seen, "hits": rule.hits})
    if method == "DELETE" and route == "rules":
        traffic.clear_rules()
        return _json(200, {})
    if method == "GET" and route == "requests":
        since = int(urllib.parse.parse_qs(split.query).get("since", ["0"])[0])
        return _json(200, {"requests": [dataclasses.asdict(r) for r in traffic.since(since)]})
    if method == "GET" and route == "requests/total":
        return _json(200, {"total": traffic.total()})
    return _error(404, f"no control route {method} {split.path}")
