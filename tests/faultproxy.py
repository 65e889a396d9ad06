"""A fault-injecting HTTP proxy for tests: it stands between the job and a real S3 endpoint (moto_server on
127.0.0.1) and fails a seeded share of the requests the way a loaded object store and its network do.

    proxy = FaultProxy(s3.endpoint_url, seed=1, rate=0.2).start()   # 127.0.0.1:<free port>
    env AWS_ENDPOINT_URL=proxy.url                                   # the job talks to the proxy
    proxy.blackout(30)                                               # every connection dropped for 30 s
    proxy.faults                                                     # Counter of what it injected
    proxy.stop()

Faults (one per request, drawn from `kinds`):
- `503`: answered by the proxy with S3's `503 SlowDown` (the request never reaches the store);
- `500`: answered with `500 InternalError` (never reaches the store);
- `reset`: the connection is reset after the request was read (never reaches the store);
- `lost`: the request IS forwarded and the store acts on it, then the connection is reset instead of the response
  (a PUT that happened but whose answer was lost: the case an idempotent lock create must recognise);
- a blackout (`blackout(seconds)`): every connection is reset at once until it ends.

Which requests fail is seeded: request k of each (method, path) fails when a hash of (seed, method, path, k) says
so, whatever order threads send them in, so a retried request gets a fresh draw. Nothing is patched: the job's
own clients (pyarrow's S3 filesystem, boto3) speak HTTP to this proxy as they would to a store.
"""

from __future__ import annotations

import collections
import hashlib
import re
import socket
import socketserver
import struct
import threading
import time
from urllib.parse import urlsplit

KINDS: tuple[str, ...] = ("503", "500", "reset", "lost")
_ERRORS = {
    "503": (b"503 Slow Down", b"SlowDown", b"Please reduce your request rate."),
    "500": (b"500 Internal Server Error", b"InternalError", b"We encountered an internal error. Please try again."),
}


def _read_head(rfile) -> bytes | None:
    """The request or response head up to the blank line, or None at EOF."""
    lines = []
    while True:
        line = rfile.readline(65537)
        if not line:
            return None
        lines.append(line)
        if line in (b"\r\n", b"\n"):
            return b"".join(lines)


def _header(head: bytes, name: str) -> str | None:
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name.lower().encode():
            return value.strip().decode("latin-1")
    return None


def _without(head: bytes, *names: str) -> bytes:
    """The head without the named headers, with `Connection: close` (one request per connection)."""
    lines = head.rstrip(b"\r\n").split(b"\r\n")
    drop = {n.lower().encode() for n in (*names, "connection", "keep-alive")}
    kept = [lines[0]] + [ln for ln in lines[1:] if ln.partition(b":")[0].strip().lower() not in drop]
    return b"\r\n".join([*kept, b"Connection: close", b"", b""])


def _read_body(rfile, head: bytes) -> bytes:
    """The message body as sent (Content-Length, or chunked with its framing kept)."""
    if (_header(head, "Transfer-Encoding") or "").lower() == "chunked":
        out = []
        while True:
            size_line = rfile.readline(65537)
            out.append(size_line)
            size = int(size_line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = rfile.readline(65537)
                    out.append(trailer)
                    if trailer in (b"\r\n", b"\n", b""):
                        return b"".join(out)
            out.append(rfile.read(size + 2))
    length = int(_header(head, "Content-Length") or 0)
    return rfile.read(length) if length else b""


def _reset(sock: socket.socket) -> None:
    """Close with a TCP reset (SO_LINGER 0), as a dropped connection looks to the client."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class FaultProxy:
    def __init__(self, upstream: str, seed: int = 0, rate: float = 0.0, kinds: tuple[str, ...] = KINDS,
                 match: str | None = None, limit: int | None = None) -> None:  # fmt: skip
        up = urlsplit(upstream)
        self.upstream = (up.hostname or "127.0.0.1", up.port or 80)
        self.seed, self.rate, self.kinds = seed, rate, tuple(kinds)
        self.match, self.limit = match, limit  # only requests whose "METHOD /path?query" matches; at most `limit`
        self.faults: collections.Counter[str] = collections.Counter()
        self.requests = 0
        self._seen: collections.Counter[str] = collections.Counter()
        self._injected = 0
        self._lock = threading.Lock()
        self._dark_until = 0.0
        self._server: socketserver.ThreadingTCPServer | None = None

    # ------------------------------------------------------------------ control
    def start(self) -> FaultProxy:
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True).start()
        return self

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set(self, rate: float, kinds: tuple[str, ...] = KINDS, match: str | None = None, limit: int | None = None,
            seed: int | None = None) -> None:  # fmt: skip
        """Fail `rate` of the requests (those matching the regex `match`, at most `limit` of them from now on)."""
        with self._lock:
            self.rate, self.kinds, self.match, self.limit = rate, tuple(kinds), match, limit
            self.seed = self.seed if seed is None else seed
            self._injected = 0

    def blackout(self, seconds: float) -> None:
        """Drop every connection for the next `seconds` (0 ends a blackout)."""
        self._dark_until = time.monotonic() + seconds

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FaultProxy:
        return self.start() if self._server is None else self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ the faults
    def _draw(self, method: str, path: str) -> str | None:
        """The fault for this request, or None: seeded by (seed, method, path, how many such requests came)."""
        with self._lock:
            self.requests += 1
            key = f"{method} {path}"
            k = self._seen[key]
            self._seen[key] += 1
            rate, kinds, seed = self.rate, self.kinds, self.seed
            if rate <= 0 or not kinds or (self.match is not None and not re.search(self.match, key)):
                return None
            digest = hashlib.sha256(f"{seed}\0{key}\0{k}".encode()).digest()
            if int.from_bytes(digest[:8], "big") / 2**64 >= rate:
                return None
            if self.limit is not None and self._injected >= self.limit:
                return None
            self._injected += 1
            return kinds[digest[8] % len(kinds)]

    def _handle(self, client: socket.socket) -> None:
        rfile = client.makefile("rb")
        try:
            if time.monotonic() < self._dark_until:
                self._count("blackout")
                _reset(client)
                return
            head = _read_head(rfile)
            if head is None:
                client.close()
                return
            if (_header(head, "Expect") or "").lower() == "100-continue":
                client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
            body = _read_body(rfile, head)
            method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
            path = rest.rsplit(" ", 1)[0]
            fault = None if path.startswith("/moto-api") else self._draw(method, path)
            if time.monotonic() < self._dark_until:
                fault = "blackout"
            if fault is not None:
                self._count(fault)
            if fault in ("reset", "blackout"):
                _reset(client)
                return
            if fault in _ERRORS:
                status, code, message = _ERRORS[fault]
                xml = (b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>' + code + b"</Code><Message>" + message
                       + b"</Message><RequestId>fault-proxy</RequestId></Error>")  # fmt: skip
                client.sendall(b"HTTP/1.1 " + status + b"\r\nContent-Type: application/xml\r\nContent-Length: "
                               + str(len(xml)).encode() + b"\r\nConnection: close\r\n\r\n" + xml)  # fmt: skip
                client.close()
                return
            response = self._forward(_without(head, "Expect") + body)
            if fault == "lost":
                _reset(client)
                return
            client.sendall(response)
            client.close()
        except OSError:
            _reset(client)
        finally:
            rfile.close()

    def _count(self, fault: str) -> None:
        with self._lock:
            self.faults[fault] += 1

    def _forward(self, request: bytes) -> bytes:
        """Send one request to the store, return its whole response with `Connection: close`."""
        with socket.create_connection(self.upstream, timeout=60) as up:
            up.sendall(request)
            rfile = up.makefile("rb")
            head = _read_head(rfile) or b""
            rest = rfile.read()  # the store closes after the response (Connection: close)
            rfile.close()
        return _without(head) + rest
