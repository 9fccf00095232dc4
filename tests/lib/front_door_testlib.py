"""A running ``lanes serve`` for the front-door tests, talked to over raw sockets.

:class:`Served` starts the server through the CLI on a free loopback port, keeps everything it
writes to stderr (a thread reads it, so the tests can check that no request made it log a
traceback) and stops it at the end, checking it exits 0. :func:`exchange` sends bytes as they
are, from a chosen loopback source address when asked (127.0.0.2 is another client to the
server), and parses the answer with ``http.client``.
"""

from __future__ import annotations

import http.client
import signal
import socket
import threading
import urllib.parse
from typing import Any, Self

from pool_testlib import cli


class Served:
    """``lanes serve ARGS --port PORT`` (0: a free one); ``base`` is its URL, ``port`` its
    port, ``log`` its stderr so far."""

    def __init__(self, *args: str, port: int = 0) -> None:
        self.args = args
        self.listen = port
        self.lines: list[str] = []

    def __enter__(self) -> Self:
        self.p = cli("serve", *self.args, "--port", str(self.listen))
        assert self.p.stdout is not None and self.p.stderr is not None
        line = self.p.stdout.readline()
        if not line.startswith("lanes serve:"):
            self.p.kill()
            raise AssertionError(line + self.p.stderr.read())
        self.base = line.split()[-1]
        self.port = int(urllib.parse.urlsplit(self.base).port or 0)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            self.lines.append(line)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def pid(self) -> int:
        return self.p.pid

    def __exit__(self, *exc: object) -> None:
        self.p.send_signal(signal.SIGTERM)
        try:
            self.p.wait(timeout=30)
        finally:
            if self.p.poll() is None:
                self.p.kill()
                self.p.wait()
            self._reader.join(timeout=10)
            assert self.p.stdout is not None
            self.p.stdout.close()
        assert self.p.returncode == 0, self.log
        assert "Traceback" not in self.log, self.log


def connect(port: int, source: str | None = None, timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(timeout)
    if source is not None:
        s.bind((source, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_answer(s: socket.socket, method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """One answer from ``s``; header names lowercased, repeated ones joined with ", "."""
    r = http.client.HTTPResponse(s, method=method)
    r.begin()
    body = r.read()
    headers: dict[str, str] = {}
    for k, v in r.getheaders():
        k = k.lower()
        headers[k] = f"{headers[k]}, {v}" if k in headers else v
    return r.status, headers, body


def exchange(port: int, data: bytes, source: str | None = None, timeout: float = 10.0,
             method: str = "GET") -> tuple[int, dict[str, str], bytes]:
    """Send ``data`` as it is on a new connection and read one answer."""
    with connect(port, source, timeout) as s:
        s.sendall(data)
        return read_answer(s, method)


def get(port: int, target: str, headers: dict[str, str] | None = None,
        source: str | None = None, method: str = "GET", body: bytes = b""
        ) -> tuple[int, dict[str, str], bytes]:
    """A well-formed request (Host 127.0.0.1:port unless given)."""
    h = {"Host": f"127.0.0.1:{port}", "Connection": "close", **(headers or {})}
    if body or method == "POST":
        h["Content-Length"] = str(len(body))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in h.items())
    return exchange(port, head.encode("latin-1") + b"\r\n" + body, source, method=method)


def cookies(headers: dict[str, Any]) -> dict[str, str]:
    jar = {}
    for part in headers.get("set-cookie", "").split(", "):
        name, _, rest = part.partition("=")
        if rest:
            jar[name.strip()] = rest.split(";", 1)[0]
    return jar
