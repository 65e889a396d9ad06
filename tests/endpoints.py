"""What the test endpoints on 127.0.0.1 (tests/s3tools.py's moto, tests/gcstools.py's GCS emulator) share: a free
port, and the environment variables that point a client at the endpoint, set for a child process or for a block of
this one.

    class MyServer(EnvEndpoint):
        SETTINGS = ("VAR_A", "VAR_B")            # every variable that changes where or as whom a client talks
        def __post_init__(self): self.env = {"VAR_A": ...}
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import ClassVar


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> list[int]:
    """`n` distinct TCP ports on 127.0.0.1 that nothing listens on (now): all bound at once, so none repeats."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class EnvEndpoint:
    """An endpoint reached the standard way: `env` holds its variables; every name in SETTINGS that `env` does not
    set is unset in the environments made here (a developer's own settings must not leak into a test)."""

    SETTINGS: ClassVar[tuple[str, ...]] = ()
    env: dict[str, str]

    def subprocess_env(self, **overrides: str | None) -> dict[str, str]:
        """os.environ with this endpoint's variables (and `overrides`; None unsets one), for a child process."""
        env = {k: v for k, v in os.environ.items() if k not in self.SETTINGS}
        env.update(self.env)
        for name, value in overrides.items():
            if value is None:
                env.pop(name, None)
            else:
                env[name] = value
        return env

    @contextlib.contextmanager
    def environ(self, **overrides: str | None) -> Iterator[dict[str, str]]:
        """Sets this endpoint's variables (and `overrides`; None unsets one) in os.environ; restores them after."""
        wanted = self.subprocess_env(**overrides)
        names = set(self.env) | set(overrides) | set(self.SETTINGS)
        saved = {name: os.environ.get(name) for name in names}
        try:
            for name in names:
                if name in wanted:
                    os.environ[name] = wanted[name]
                else:
                    os.environ.pop(name, None)
            yield {name: wanted[name] for name in names if name in wanted}
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
