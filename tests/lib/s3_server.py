"""A throwaway S3 API server for the tests and benchmarks (a helper, not a test file).

``S3Server`` runs moto's standalone server (``moto_server``, the ``moto[server]`` test
dependency) on a loopback port, with credentials of its own in the environment it hands out
(``env``), and makes the bucket. moto keeps objects in memory: ``kill`` (SIGKILL) loses them,
``start`` again brings an empty server back on the same port (and makes the bucket again), so a
test of a restart sees every blob gone, a harsher fault than a real service's restart.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.request
from typing import Any

from redis_server import free_port

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "lanes-test", "AWS_SECRET_ACCESS_KEY": "lanes-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


def credentials_in_environment() -> None:
    """The test credentials where boto3's chain finds them first (this process and its
    children); nothing leaves the machine: every store names the local endpoint."""
    os.environ.update(CREDENTIALS)
    os.environ.pop("AWS_PROFILE", None)


class S3Server:
    """moto's S3 API server on ``host:port`` (loopback by default); ``endpoint`` is what
    ``--store-endpoint`` takes."""

    def __init__(self, bucket: str = "lanes-test", port: int | None = None,
                 host: str = "127.0.0.1") -> None:
        self.bucket = bucket
        self.host = host  # a test host's link address, for hosts in network namespaces
        self.port = port or free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _binary(self) -> list[str]:
        found = shutil.which("moto_server", path=os.path.dirname(sys.executable))
        if found is None:
            raise FileNotFoundError("moto_server is not installed (the test extra's moto[server])")
        return [found]

    def start(self, timeout: float = 20.0) -> S3Server:
        credentials_in_environment()
        env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        self.proc = subprocess.Popen([*self._binary(), "-H", self.host, "-p", str(self.port)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, env=env)
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("moto_server did not start")
            time.sleep(0.05)
        self.client().create_bucket(Bucket=self.bucket)
        return self

    def ping(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1):
                return True
        except OSError:
            return False

    def client(self) -> Any:
        import boto3

        return boto3.session.Session(**{k.lower(): v for k, v in CREDENTIALS.items()
                                        if k != "AWS_DEFAULT_REGION"},
                                     region_name="us-east-1").client(
            "s3", endpoint_url=self.endpoint)

    def kill(self) -> None:
        """The crash: SIGKILL (moto's objects are gone with it)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> S3Server:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
