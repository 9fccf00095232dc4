"""A throwaway redis-server for the tests (a helper, not a test file).

Started on a unix socket in a fresh temporary directory, with no TCP port, no snapshots and no
AOF, so nothing it does reaches the network or outlives it; ``stop`` ends the process (SIGTERM,
then SIGKILL) and removes the directory. No fakeredis: the tests run the real Lua library on a
real server.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time


def find_server() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)


class RedisServer:
    """One redis-server process on a unix socket; ``url`` is what ``Engine.connect`` takes."""

    def __init__(self, binary: str | None = None, extra: tuple[str, ...] = ()) -> None:
        self.binary = binary or find_server()
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed (make test installs it)")
        self.extra = extra
        self.dir = ""
        self.socket = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = 10.0) -> RedisServer:
        self.dir = tempfile.mkdtemp(prefix="rl-redis-")
        self.socket = os.path.join(self.dir, "redis.sock")
        assert self.binary is not None
        self.proc = subprocess.Popen(
            [self.binary, "--port", "0", "--unixsocket", self.socket, "--unixsocketperm", "700",
             "--save", "", "--appendonly", "no", "--dir", self.dir, "--daemonize", "no",
             "--logfile", os.path.join(self.dir, "redis.log"), *self.extra],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})  # not sanitized
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"redis-server did not start: {log[-2000:]}")
            time.sleep(0.02)
        return self

    def ping(self) -> bool:
        import redis

        try:
            client = redis.Redis(unix_socket_path=self.socket, socket_timeout=1)
            try:
                return bool(client.ping())
            finally:
                client.close()
        except (redis.exceptions.ConnectionError, OSError):
            return False

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
