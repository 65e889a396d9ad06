"""Rendering (jinja2, jobs.pages' environment) and the read-only HTTP server of `xsbert serve`."""

from __future__ import annotations

import traceback
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from xsbert_core import InputError

from .pages import (
    HEADERS,
    ROUTES,
    Params,
)
from .run import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    App,
    BadRequest,
    Busy,
    NotFound,
    Page,
)


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


def make_handler(app: App, renderer: Renderer, log: Callable[[str], None] | None = None):
    class Handler(BaseHTTPRequestHandler):
        server_version = "xsbert-serve"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            if log is not None:
                log(f"{self.address_string()} {format % args}")

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

        def _get(self, head: bool) -> None:
            url = urllib.parse.urlsplit(self.path)
            route = ROUTES.get(url.path)
            if route is None:
                return self._error(HTTPStatus.NOT_FOUND, f"no page {url.path} (pages: /pairs, /pair, /tokens, "
                                   "/token)", head)  # fmt: skip
            template, fn = route
            page = Page(app.con, app.command)
            try:
                p = Params(url.query)
                context = fn(app, page, p)
                body = renderer.render(template, page, p, url.path, **context)
            except BadRequest as exc:
                return self._error(HTTPStatus.BAD_REQUEST, str(exc), head)
            except NotFound as exc:
                return self._error(HTTPStatus.NOT_FOUND, str(exc), head)
            except Busy as exc:
                return self._error(HTTPStatus.SERVICE_UNAVAILABLE, str(exc), head)
            except Exception as exc:  # noqa: BLE001 - one line to the browser, the traceback to the log
                if log is not None:
                    log(traceback.format_exc())
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                return self._error(HTTPStatus.INTERNAL_SERVER_ERROR, f"{type(exc).__name__}: {first}", head)
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


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def make_server(app: App, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT,
                log: Callable[[str], None] | None = None) -> Server:  # fmt: skip
    """The HTTP server (not started: call serve_forever); port 0 picks a free one."""
    try:
        return Server((host, port), make_handler(app, Renderer(app), log))
    except OSError as exc:
        raise InputError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
