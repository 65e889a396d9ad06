"""Headless Chromium driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending in
NUL on file descriptors 3 and 4), with no client library: navigate, evaluate JavaScript, type, screenshot.

    with Chromium() as browser:
        browser.goto("http://127.0.0.1:8000/pairs")
        n = browser.eval("document.querySelectorAll('tr.pair').length")

Debian's `chromium` package provides the binary (.ci/run installs it); `find_chromium()` is None without it.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    return next((path for path in map(shutil.which, NAMES) if path), None)


class Chromium:
    def __init__(self, width: int = 1400, height: int = 1000, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.size = (width, height)
        self._id = 0
        self._buffer = b""

    def __enter__(self) -> Chromium:
        binary = find_chromium()
        if binary is None:
            raise RuntimeError("no chromium binary")
        self._profile = tempfile.mkdtemp(prefix="xsbert-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds_3_and_4() -> None:  # in the child: the browser reads commands on fd 3 and writes answers on fd 4
            r, w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(r, 3)
            os.dup2(w, 4)

        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-pipe", "--no-first-run",
             "--no-default-browser-check", f"--user-data-dir={self._profile}", f"--window-size={self.size[0]},{self.size[1]}",
             "about:blank"],
            pass_fds=(3, 4, to_browser_r, from_browser_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, preexec_fn=fds_3_and_4,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        target = self._send("Target.createTarget", {"url": "about:blank"})["targetId"]
        self.session = self._send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": self.size[0], "height": self.size[1],
                                                          "deviceScaleFactor": 1, "mobile": False})  # fmt: skip
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._send("Browser.close", {}, wait=False)
        except OSError:
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._profile, ignore_errors=True)

    # ------------------------------------------------------------------ protocol
    def _write(self, message: dict[str, Any]) -> None:
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")

    def _read(self) -> dict[str, Any]:
        deadline = time.monotonic() + self.timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from chromium")
            chunk = os.read(self._from_browser, 1 << 16)
            if not chunk:
                raise RuntimeError("chromium closed its pipe")
            self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
              wait: bool = True) -> dict[str, Any]:  # fmt: skip
        self._id += 1
        message: dict[str, Any] = {"id": self._id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._write(message)
        if not wait:
            return {}
        while True:
            answer = self._read()
            if answer.get("id") == self._id:
                if "error" in answer:
                    raise RuntimeError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            # anything else is an event (Page.loadEventFired, ...): not needed, dropped

    def call(self, method: str, params: dict[str, Any] | None = None) -> dict[str, Any]:
        return self._send(method, params, self.session)

    # ------------------------------------------------------------------ what a test does
    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-serialisable values)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails'].get('text')}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Poll a JavaScript expression until it is truthy; its value."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"never true: {expression}")

    def goto(self, url: str) -> None:
        """Load a URL and wait until the document is complete."""
        self.eval("window.__xsbert_old = 1")
        self.call("Page.navigate", {"url": url})
        self.wait_for("!window.__xsbert_old && document.readyState === 'complete'")

    def submit_after(self, action: str) -> None:
        """Run a JavaScript statement that navigates (a form submit, a click) and wait for the new page."""
        self.eval("window.__xsbert_old = 1")
        self.eval(action)
        self.wait_for("!window.__xsbert_old && document.readyState === 'complete'")

    def type_into(self, selector: str, text: str) -> None:
        """Focus an input, clear it and type `text` as keyboard input."""
        self.eval(f"(e => {{ e.focus(); e.select(); }})(document.querySelector({json.dumps(selector)}))")
        self.call("Input.insertText", {"text": text})

    def press_enter(self) -> None:
        self.eval("window.__xsbert_old = 1")
        for kind in ("keyDown", "keyUp"):
            self.call("Input.dispatchKeyEvent", {"type": kind, "key": "Enter", "code": "Enter",
                                                 "windowsVirtualKeyCode": 13, "text": "\r" if kind == "keyDown" else ""})  # fmt: skip
        self.wait_for("!window.__xsbert_old && document.readyState === 'complete'")

    def screenshot(self) -> bytes:
        """PNG of the viewport."""
        return base64.b64decode(self.call("Page.captureScreenshot", {"format": "png"})["data"])
