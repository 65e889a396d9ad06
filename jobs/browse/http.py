"""Rendering (jinja2, jobs.pages' environment) and the read-only HTTP server of `xsbert serve`.

The server answers only requests addressed to it: the Host header (or an absolute URI's host) must be the address
it listens on, a loopback address or `localhost` (with its port), as Jupyter and the Ray dashboard check it, so a
web page whose DNS name is rebound to 127.0.0.1 cannot read a run from the user's browser. Its work is bounded:
a pool of worker threads, a few requests waiting for one, and a 503 with Retry-After beyond that."""

from __future__ import annotations

import contextlib
import ipaddress
import queue
import socket
import threading
import traceback
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import duckdb

from xsbert_core import InputError

from ..config import SERVE_HOST, SERVE_PORT
from ..sqlrun import one_line
from .download import DOWNLOADS
from .pages import (
    HEADERS,
    ROUTES,
    Params,
    check_run,
)
from .run import (
    DEFAULT_WORKERS,
    LISTEN_BACKLOG,
    REQUEST_TIMEOUT_S,
    RETRY_AFTER_S,
    WAITING_PER_WORKER,
    App,
    BadRequest,
    Busy,
    NotFound,
    Page,
)

WILDCARDS = ("", "0.0.0.0", "::")


def environment():
    from ..pages import environment as report_environment

    env = report_environment()
    env.filters["signed"] = lambda x, d=4: "" if x is None else f"{x:+.{d}f}"
    env.filters["num"] = lambda x, d=4: "" if x is None else (f"{x:,}" if isinstance(x, int) else f"{x:.{d}g}")
    return env


class Renderer:
    def __init__(self, app: App) -> None:
        self.app = app
        self.env = environment()

    def render(self, template: str, page: Page | None, p: Params | None, path: str, **context: Any) -> str:
        return self.env.get_template(template).render(
            app=self.app, runs=self.app.runs(), queries=page.queries if page else [], params=p, path=path,
            link=(p.link if p is not None else (lambda **_: "")), **context)  # fmt: skip


def is_loopback(name: str) -> bool:
    """Whether a host name or address (as --host or a request's Host gives it) is this machine only: `localhost` or a
    loopback address (127.0.0.0/8, ::1)."""
    name = name.lower().strip("[]").rstrip(".")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def host_allowed(value: str | None, listen: str, port: int) -> bool:
    """Whether a request's Host (`name[:port]`, `[v6]:port`) names this server: `localhost` or a loopback address,
    the address it listens on (`listen`, as --host gave it), and where it listens on every address (0.0.0.0, ::) any
    IP address or this machine's own name; always with the server's port (none only for port 80). A DNS name that an
    attacker controls is never among them, whatever address it resolves to."""
    if not value:
        return False
    value = value.strip()
    if value.startswith("["):
        name, close, rest = value[1:].partition("]")
        if not close or (rest and not rest.startswith(":")):
            return False
        given_port = rest[1:]
    else:
        name, _, given_port = value.partition(":")
    if given_port:
        if not given_port.isdigit() or int(given_port) != port:
            return False
    elif port != 80:
        return False
    name = name.lower().rstrip(".")
    if not name:
        return False
    if is_loopback(name):
        return True
    if name == listen.lower().strip("[]").rstrip("."):
        return True
    if listen in WILDCARDS:
        return _is_ip(name) or name in {socket.gethostname().lower(), socket.getfqdn().lower()}
    return False


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def make_handler(app: App, renderer: Renderer, log: Callable[[str], None] | None = None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "xsbert-serve"
        sys_version = ""
        timeout = REQUEST_TIMEOUT_S  # a client that stalls frees its worker

        def log_message(self, format: str, *args: Any) -> None:
            if log is not None:
                log(f"{self.address_string()} {format % args}")

        def parse_request(self) -> bool:
            """The request line and headers, then the Host check (400 without a Host, 403 for another host)."""
            if not super().parse_request():
                return False
            head = self.command == "HEAD"
            host = self.headers.get("Host")
            target = urllib.parse.urlsplit(self.path)
            listen, port = self.server.listen, self.server.server_address[1]  # type: ignore[attr-defined]
            if not host:
                self._error(HTTPStatus.BAD_REQUEST, "no Host header: this server answers requests for "
                            f"http://{_shown(listen)}:{port}/ or localhost", head)  # fmt: skip
                return False
            self.close_connection = True  # one request per connection (HTTP/1.0), whatever the client asks
            for name in ([target.netloc] if target.scheme or target.netloc else []) + [host]:
                if not host_allowed(name, listen, port):
                    self._error(HTTPStatus.FORBIDDEN, f"host {name[:200]!r} is not this server: it answers requests "
                                f"for http://{_shown(listen)}:{port}/ or localhost", head)  # fmt: skip
                    return False
            return True

        def _send(self, status: int, body: str, content_type: str = "text/html; charset=utf-8",
                  head: bool = False) -> None:  # fmt: skip
            data = body.encode("utf-8")
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            for k, v in HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if not head:
                self.wfile.write(data)

        def _error(self, status: HTTPStatus, message: str, head: bool) -> None:
            body = renderer.render("serve_error.html", None, None, "", status=int(status), phrase=status.phrase,
                                   message=message)  # fmt: skip
            self._send(int(status), body, head=head)

        def _failed(self, exc: Exception, head: bool) -> None:
            """The error page for what a page or a download raised (called in its except block): 400, 404 or 503
            with the message; a run's file that DuckDB cannot read (changed or damaged under the server) 500 with
            one line to the browser and to the log; anything else 500 with one line to the browser and the
            traceback to the log."""
            for kind, status in ((BadRequest, HTTPStatus.BAD_REQUEST), (NotFound, HTTPStatus.NOT_FOUND),
                                 (Busy, HTTPStatus.SERVICE_UNAVAILABLE)):  # fmt: skip
                if isinstance(exc, kind):
                    return self._error(status, str(exc), head)
            if isinstance(exc, duckdb.IOException | duckdb.InvalidInputException):
                message = (f"the run cannot be read ({one_line(exc)}): its files changed or were damaged since the "
                           "server started; restart it on a whole run")  # fmt: skip
                if log is not None:
                    log(f"{self.command} {self.path}: 500: {message}")
                return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, message, head)
            if log is not None:
                log(traceback.format_exc())
            return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {one_line(exc)}", head)

        def _download(self, url: urllib.parse.SplitResult, head: bool) -> None:
            """A list page's rows as CSV, streamed (one request per connection: the end of the answer is the end
            of the connection); an error before the first row is an error page."""
            try:
                p = Params(url.query)
                check_run(app, p)
                download = DOWNLOADS[url.path](app, p)
                chunks = download.chunks(app.con)
                first = next(chunks)
            except Exception as exc:  # noqa: BLE001 - an error page (_failed)
                return self._failed(exc, head)
            self.send_response(200)
            self.send_header("Content-Type", "text/csv; charset=utf-8")
            self.send_header("Content-Disposition", f'attachment; filename="{download.filename}"')
            for k, v in HEADERS.items():
                self.send_header(k, v)
            self.end_headers()
            if head:
                chunks.close()
                return
            try:
                self.wfile.write(first.encode("utf-8"))
                for chunk in chunks:
                    self.wfile.write(chunk.encode("utf-8"))
            finally:
                chunks.close()

        def _get(self, head: bool) -> None:
            url = urllib.parse.urlsplit(self.path)
            if url.path in DOWNLOADS:
                return self._download(url, head)
            route = ROUTES.get(url.path)
            if route is None:
                return self._error(HTTPStatus.NOT_FOUND, f"no page {url.path} (pages: /pairs, /pair, /tokens, "
                                   "/token; their rows as CSV: /pairs.csv, /tokens.csv, /token.csv)", head)  # fmt: skip
            template, fn = route
            page = Page(app.con, app.command)
            try:
                p = Params(url.query)
                check_run(app, p)
                context = fn(app, page, p)
                body = renderer.render(template, page, p, url.path, **context)
            except Exception as exc:  # noqa: BLE001 - an error page (_failed)
                return self._failed(exc, head)
            finally:
                page.close()
            self._send(200, body, head=head)

        def do_GET(self) -> None:
            self._get(head=False)

        def do_HEAD(self) -> None:
            self._get(head=True)

        def _read_only(self) -> None:
            self._error(HTTPStatus.METHOD_NOT_ALLOWED, "read-only: GET and HEAD only", False)

        do_POST = do_PUT = do_DELETE = do_PATCH = _read_only

    return Handler


def _shown(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _busy_response(workers: int) -> bytes:
    body = (f"busy: {workers} requests are being answered and more are waiting; retry in {RETRY_AFTER_S} s\n").encode()
    head = [f"HTTP/1.0 503 {HTTPStatus.SERVICE_UNAVAILABLE.phrase}", f"Retry-After: {RETRY_AFTER_S}",
            "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}", "Connection: close",
            *(f"{k}: {v}" for k, v in HEADERS.items())]  # fmt: skip
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Server(HTTPServer):
    """An HTTP server with a bounded pool: `workers` threads answer, `waiting` more requests wait for one, and a
    request beyond those is answered 503 with Retry-After by one thread of its own (which reads the request first,
    so the client sees the answer rather than a reset), or closed at once when even that one is behind."""

    allow_reuse_address = True
    request_queue_size = LISTEN_BACKLOG

    def __init__(self, address: tuple[str, int], handler: Any, listen: str, workers: int = DEFAULT_WORKERS,
                 waiting: int | None = None) -> None:  # fmt: skip
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        self.listen = listen
        self.workers = workers
        self.pool = ThreadPoolExecutor(workers, thread_name_prefix="xsbert-serve")
        self.slots = threading.BoundedSemaphore(workers + (WAITING_PER_WORKER * workers if waiting is None else waiting))
        self.refused: queue.Queue[socket.socket | None] = queue.Queue(maxsize=LISTEN_BACKLOG)
        self.busy_answer = _busy_response(workers)
        super().__init__(address, handler)  # binds: a port in use closes the server (server_close) and raises
        threading.Thread(target=self._refuse, name="xsbert-serve-busy", daemon=True).start()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            try:
                self.refused.put_nowait(request)
            except queue.Full:
                self.shutdown_request(request)
            return
        try:
            self.pool.submit(self._work, request, client_address)
        except RuntimeError:  # the pool is shut down: the server is closing
            self.slots.release()
            self.shutdown_request(request)

    def _work(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:  # noqa: BLE001 - as socketserver does: logged, the connection closed
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)
            self.slots.release()

    def _refuse(self) -> None:
        while (request := self.refused.get()) is not None:
            try:
                request.settimeout(2.0)
                seen = b""
                while b"\r\n\r\n" not in seen and b"\n\n" not in seen and len(seen) < 65536:
                    chunk = request.recv(4096)
                    if not chunk:
                        break
                    seen += chunk
                request.sendall(self.busy_answer)
            except OSError:
                pass
            finally:
                self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        with contextlib.suppress(queue.Full):
            self.refused.put_nowait(None)
        self.pool.shutdown(wait=False, cancel_futures=True)


def make_server(app: App, host: str = SERVE_HOST, port: int = SERVE_PORT,
                log: Callable[[str], None] | None = None, workers: int = DEFAULT_WORKERS,
                waiting: int | None = None) -> Server:  # fmt: skip
    """The HTTP server (not started: call serve_forever); port 0 picks a free one. `workers` requests are answered at
    once, `waiting` (default WAITING_PER_WORKER per worker) more wait, the rest get a 503 with Retry-After."""
    try:
        return Server((host, port), make_handler(app, Renderer(app), log), host, workers, waiting)
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
