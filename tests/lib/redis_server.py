"""Throwaway redis-servers for the tests and benchmarks (a helper, not a test file).

``RedisServer`` starts one on a unix socket (and a loopback TCP port if asked) in a fresh
temporary directory, with no snapshots and no AOF unless asked (``aof=True``: ``appendonly yes``,
``appendfsync always``), so nothing it does reaches the network or outlives it. ``kill`` is
the crash (SIGKILL, the directory kept), ``start`` again restarts it on the same directory and
socket, so it reloads its AOF. ``stop`` ends the process (SIGTERM, then SIGKILL) and removes the
directory. ``LocalCluster`` is a Redis Cluster of such servers on loopback TCP ports, made with
``redis-cli --cluster create``. No fakeredis: the tests run the real Lua library on a real server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator


def find_server() -> str | None:
    return shutil.which("redis-server") or (
        "/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)


def free_port(also_free: int = 0) -> int:
    """A loopback TCP port nobody listens on (and ``port + also_free`` free too, the offset a
    cluster bus takes). Racy by nature: good enough for a test on one machine."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not also_free or port + also_free > 65535:
            if not also_free:
                return port
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port + also_free))
            return port
        except OSError:
            continue


class RedisServer:
    """One redis-server process on a unix socket, and on a loopback TCP port too when
    ``port`` is given; ``url`` (TCP when there is a port) is what ``Engine.connect`` takes."""

    def __init__(self, binary: str | None = None, extra: tuple[str, ...] = (), *,
                 aof: bool = False, port: int | None = None, prefix: str = "rl-redis-") -> None:
        self.binary = binary or find_server()
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed (make test installs it)")
        self.extra = extra
        self.prefix = prefix  # of the temporary directory (the benchmarks' is rl-bench-)
        self.aof = aof
        self.port = port  # None: the unix socket only
        self.dir = ""
        self.socket = ""
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.unix_url if self.port is None else f"redis://127.0.0.1:{self.port}"

    @property
    def unix_url(self) -> str:
        return f"unix://{self.socket}"

    def _args(self) -> list[str]:
        where = ["--port", str(self.port or 0), "--bind", "127.0.0.1", "--unixsocket",
                 self.socket, "--unixsocketperm", "700"]
        persist = (["--appendonly", "yes", "--appendfsync", "always"] if self.aof
                   else ["--appendonly", "no"])
        assert self.binary is not None
        return [self.binary, *where, "--save", "", *persist, "--dir", self.dir,
                "--daemonize", "no", "--logfile", os.path.join(self.dir, "redis.log"),
                *self.extra]

    def start(self, timeout: float = 10.0) -> RedisServer:
        """Start; a second start (after ``kill``) reuses the directory, so it reloads its AOF."""
        if not self.dir:
            self.dir = tempfile.mkdtemp(prefix=self.prefix)
            self.socket = os.path.join(self.dir, "redis.sock")
        self.proc = subprocess.Popen(
            self._args(), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"})  # not sanitized
        deadline = time.monotonic() + timeout
        while not self.ping():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                log = self.log()
                self.stop()
                raise RuntimeError(f"redis-server did not start: {log[-2000:]}")
            time.sleep(0.02)
        return self

    def client(self, tcp: bool | None = None, **kw: object) -> object:
        """A redis-py client: over TCP when ``tcp`` (default: when there is a port)."""
        import redis

        if tcp is None:
            tcp = self.port is not None
        if not tcp:
            return redis.Redis(unix_socket_path=self.socket, **kw)  # type: ignore[arg-type]
        return redis.Redis(host="127.0.0.1", port=self.port, **kw)  # type: ignore[arg-type]

    def ping(self) -> bool:
        import redis

        try:
            client = self.client(socket_timeout=1)
            try:
                return bool(client.ping())  # type: ignore[attr-defined]
            finally:
                client.close()  # type: ignore[attr-defined]
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError):
            return False
        except redis.exceptions.ResponseError:  # loading the AOF: up, not ready
            return False

    def log(self) -> str:
        try:
            with open(os.path.join(self.dir, "redis.log")) as f:
                return f.read()
        except OSError:
            return ""

    def kill(self) -> None:
        """The crash: SIGKILL, no shutdown, the directory (AOF, socket path) kept."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

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


class LocalCluster:
    """``primaries`` cluster-enabled servers on free loopback ports (each with its bus port,
    port + 10000, free), joined with ``redis-cli --cluster create --cluster-replicas 0``;
    ``stop`` ends them all and removes their directories."""

    BUS_OFFSET = 10_000

    def __init__(self, primaries: int = 3) -> None:
        self.nodes = [RedisServer(port=free_port(self.BUS_OFFSET),
                                  extra=("--cluster-enabled", "yes",
                                         "--cluster-config-file", "nodes.conf",
                                         "--cluster-node-timeout", "2000"))
                      for _ in range(primaries)]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self, timeout: float = 20.0) -> LocalCluster:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise FileNotFoundError("redis-cli is not installed (it comes with redis-server)")
        try:
            for node in self.nodes:
                node.start()
            subprocess.run([cli, "--cluster", "create",
                            *(f"127.0.0.1:{n.port}" for n in self.nodes),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=timeout)
            deadline = time.monotonic() + timeout
            while not self.ready():
                if time.monotonic() > deadline:
                    raise RuntimeError("the cluster never reached cluster_state:ok")
                time.sleep(0.05)
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Every node says cluster_state:ok and knows every slot."""
        for node in self.nodes:
            info = node.client().cluster("info")  # type: ignore[attr-defined]
            if info.get("cluster_state") != "ok" or int(info["cluster_slots_assigned"]) != 16384:
                return False
        return True

    def node_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot (CLUSTER KEYSLOT, CLUSTER SLOTS)."""
        c = self.nodes[0].client()
        slot = int(c.cluster("keyslot", key))  # type: ignore[attr-defined]
        for lo, hi, primary, *_ in c.execute_command("CLUSTER SLOTS"):  # type: ignore[attr-defined]
            if lo <= slot <= hi:
                return int(primary[1])
        raise LookupError(f"no node serves slot {slot}")

    def move_slot(self, key: str, to_port: int) -> None:
        """Migrate ``key``'s slot, keys and all, to the primary at ``to_port`` (the steps of
        the Cluster specification: IMPORTING, MIGRATING, MIGRATE, SETSLOT NODE everywhere)."""
        by_port = {n.port: n.client() for n in self.nodes}
        src, dst = by_port[self.node_of(key)], by_port[to_port]
        slot = int(src.cluster("keyslot", key))  # type: ignore[attr-defined]
        src_id = src.execute_command("CLUSTER MYID").decode()  # type: ignore[attr-defined]
        dst_id = dst.execute_command("CLUSTER MYID").decode()  # type: ignore[attr-defined]
        dst.execute_command("CLUSTER SETSLOT", slot, "IMPORTING", src_id)  # type: ignore
        src.execute_command("CLUSTER SETSLOT", slot, "MIGRATING", dst_id)  # type: ignore
        keys = src.execute_command("CLUSTER GETKEYSINSLOT", slot, 1000)  # type: ignore
        if keys:
            src.execute_command("MIGRATE", "127.0.0.1", to_port, "", 0, 5000,  # type: ignore
                                "KEYS", *keys)
        for client in by_port.values():
            client.execute_command("CLUSTER SETSLOT", slot, "NODE", dst_id)  # type: ignore
        deadline = time.monotonic() + 10
        while self.node_of(key) != to_port or not self.ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"slot {slot} did not move")
            time.sleep(0.05)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def module_server() -> Iterator[RedisServer]:
    """A pytest fixture's body: one server for a test module, checked gone afterwards."""
    srv = RedisServer().start()
    yield srv
    srv.stop()
    assert srv.proc is not None and srv.proc.poll() is not None
    assert not os.path.exists(srv.dir)


def fresh_queue(server: RedisServer, prefix: str) -> Iterator[str]:
    """A pytest fixture's body: a fresh queue name; the queue and its pool's URL keys are
    dropped afterwards."""
    import uuid

    from engine import Engine
    from engine.errors import SegmentMissing
    from engine.redis.urls import RedisUrls

    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    yield name
    try:
        eng = Engine.connect(server.url, name)
    except SegmentMissing:
        return
    RedisUrls(eng).drop()
    eng.drop()
    eng.close()
