"""What the tests' local web sites share: a threaded HTTP server on a free loopback port, run
on a thread of its own, started and closed by a ``with`` block.

A site subclasses :class:`LocalSite`, names its request handler (``handler``, whose
``self.server.site`` is the site) and may count the connections that broke (``on_error``).
``close`` sets ``closing`` first, so that answers made to hang end, then stops serving and
joins every request thread: nothing of a site outlives its ``with``.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, Self


class SiteHttpServer(ThreadingHTTPServer):
    site: LocalSite
    daemon_threads = True
    block_on_close = True  # server_close() joins the request threads
    request_queue_size = 128  # the default 5 drops a burst of connects (then retried 1 s later)

    def handle_error(self, request: Any, client_address: Any) -> None:
        self.site.on_error()  # a client that hung up mid-answer: no traceback on stderr


class LocalSite:
    """A local site; subclasses set ``handler`` and call ``super().__init__()``."""

    handler: ClassVar[type[BaseHTTPRequestHandler]]

    def __init__(self) -> None:
        self.closing = threading.Event()  # answers made to hang end when it is set
        self._httpd: SiteHttpServer | None = None
        self._thread: threading.Thread | None = None

    def on_error(self) -> None:
        """A connection broke mid-answer (quiet by default)."""

    def start(self) -> Self:
        httpd = SiteHttpServer(("127.0.0.1", 0), self.handler)
        httpd.site = self
        self._httpd = httpd
        self._thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=type(self).__name__, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving, end what hangs, wait for the requests in hand; idempotent."""
        if self._httpd is None:
            return
        self.closing.set()
        self._httpd.shutdown()  # the serve loop returns
        self._httpd.server_close()  # closes the socket and joins the request threads
        assert self._thread is not None
        self._thread.join()
        self._httpd = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("the site is not running")
        return int(self._httpd.server_address[1])
