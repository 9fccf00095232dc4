"""Throwaway redis-servers for the tests and benchmarks (a helper, not a test file).

``RedisServer`` starts one on a unix socket (and a loopback TCP port if asked) in a fresh
temporary directory, with no snapshots and no AOF unless asked (``aof=True``: ``appendonly yes``,
``appendfsync always``), so nothing it does reaches the network or outlives it. ``kill`` is
the crash (SIGKILL, the directory kept), ``start`` again restarts it on the same directory and
socket, so it reloads its AOF. ``stop`` ends the process (SIGTERM, then SIGKILL) and removes the
directory. ``LocalCluster`` is a Redis Cluster of such servers on loopback TCP ports, made with
``redis-cli --cluster create``, with ``replicas`` replicas per primary if asked. ``SentinelGroup``
is a standalone primary, its replica and three ``redis-sentinel`` processes watching them, with
failover timeouts tuned low for tests. No fakeredis: the tests run the real Lua library on a real
server.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any


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


FAST_SYNC = ("--repl-diskless-sync-delay", "0")
"""A replica that (re)connects is synced at once, not after Redis's default 5 s wait for more."""


def wait_for(what: Callable[[], bool], timeout: float, why: str) -> None:
    """Until ``what()`` holds (an error from a server starting or just killed is a no), or
    ``RuntimeError(why)`` after ``timeout`` seconds."""
    import redis.exceptions as redis_errors

    deadline = time.monotonic() + timeout
    while True:
        try:
            if what():
                return
        except (OSError, LookupError, redis_errors.RedisError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(why)
        time.sleep(0.05)


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
    port + 10000, free), and ``replicas`` replicas of each, joined with ``redis-cli --cluster
    create --cluster-replicas``; ``stop`` ends them all and removes their directories.
    ``node_timeout_ms`` is the cluster-node-timeout: a primary unreachable that long is failed
    over to its replica."""

    BUS_OFFSET = 10_000

    def __init__(self, primaries: int = 3, replicas: int = 0,
                 node_timeout_ms: int = 2000) -> None:
        self.replicas = replicas
        self.nodes = [RedisServer(port=free_port(self.BUS_OFFSET),
                                  extra=(*FAST_SYNC, "--cluster-enabled", "yes",
                                         "--cluster-config-file", "nodes.conf",
                                         "--cluster-node-timeout", str(node_timeout_ms)))
                      for _ in range(primaries * (1 + replicas))]

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
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=timeout)
            replicas = len(self.nodes) // (1 + self.replicas) * self.replicas
            wait_for(lambda: self.ready() and sum(
                self.role(n) == "slave" for n in self.nodes) == replicas, timeout,
                "the cluster never reached cluster_state:ok with its replicas in sync")
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Every running node says cluster_state:ok and knows every slot, and every running
        replica is in sync with its primary."""
        for node in self.running():
            client: Any = node.client()
            info = client.cluster("info")
            if info.get("cluster_state") != "ok" or int(info["cluster_slots_assigned"]) != 16384:
                return False
            repl = client.info("replication")
            if repl["role"] == "slave" and repl.get("master_link_status") != "up":
                return False
        return True

    def running(self) -> list[RedisServer]:
        return [n for n in self.nodes if n.proc is not None and n.proc.poll() is None]

    def role(self, node: RedisServer) -> str:
        return str(node.client().info("replication")["role"])  # type: ignore[attr-defined]

    def by_port(self, port: int) -> RedisServer:
        return next(n for n in self.nodes if n.port == port)

    def node_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot (CLUSTER KEYSLOT, CLUSTER SLOTS),
        asked of the first running node."""
        c = self.running()[0].client()
        slot = int(c.cluster("keyslot", key))  # type: ignore[attr-defined]
        for lo, hi, primary, *_ in c.execute_command("CLUSTER SLOTS"):  # type: ignore[attr-defined]
            if lo <= slot <= hi:
                return int(primary[1])
        raise LookupError(f"no node serves slot {slot}")

    def begin_move(self, key: str, to_port: int) -> SlotMove:
        """Start migrating ``key``'s slot to the primary at ``to_port`` (IMPORTING there,
        MIGRATING here); the keys move with ``SlotMove.migrate``, the slot with
        ``SlotMove.hand_over``."""
        masters: dict[int, Any] = {int(n.port or 0): n.client() for n in self.running()
                                   if self.role(n) == "master"}
        src, dst = masters[self.node_of(key)], masters[to_port]
        move = SlotMove(self, key, int(src.cluster("keyslot", key)), src, to_port,
                        dst.execute_command("CLUSTER MYID").decode(), list(masters.values()))
        dst.execute_command("CLUSTER SETSLOT", move.slot, "IMPORTING",
                            src.execute_command("CLUSTER MYID").decode())
        src.execute_command("CLUSTER SETSLOT", move.slot, "MIGRATING", move.dst_id)
        return move

    def move_slot(self, key: str, to_port: int, pause_s: float = 0.0) -> None:
        """Migrate ``key``'s slot, keys and all, to the primary at ``to_port`` (the steps of
        the Cluster specification: IMPORTING, MIGRATING, MIGRATE, SETSLOT NODE everywhere).
        With ``pause_s``, one key per MIGRATE and a pause after each, and another before the
        slot is handed over: clients meet the slot half moved (TRYAGAIN) and wholly moved but
        still migrating (ASK)."""
        move = self.begin_move(key, to_port)
        # A write may make a key on the source meanwhile: move until none is left.
        while keys := move.keys():
            for part in ([[k] for k in keys] if pause_s else [keys]):
                move.migrate(part)
                time.sleep(pause_s)
        time.sleep(pause_s)
        move.hand_over()

    def fail_over(self, key: str, timeout: float = 20.0) -> tuple[RedisServer, int]:
        """SIGKILL the primary serving ``key`` and wait until its replica serves the slot;
        (the node killed, the new primary's port)."""
        old = self.by_port(self.node_of(key))
        old.kill()
        wait_for(lambda: self.node_of(key) != old.port, timeout,
                  f"no replica took over from {old.port}")
        return old, self.node_of(key)

    def rejoin(self, node: RedisServer, timeout: float = 20.0) -> None:
        """Restart a killed node: it keeps its nodes.conf, learns that its slots have a newer
        owner and becomes that owner's replica; wait until it is in sync."""
        node.start()
        wait_for(lambda: self.role(node) == "slave" and self.ready(), timeout,
                  f"{node.port} did not rejoin as a replica")

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()



@dataclass
class SlotMove:
    """A slot migrating from the ``src`` primary to the one at ``to_port`` (``begin_move``)."""

    cluster: LocalCluster
    key: str
    slot: int
    src: Any
    to_port: int
    dst_id: str
    masters: list[Any]

    def keys(self) -> list[bytes]:
        """The slot's keys still on the source."""
        return list(self.src.execute_command("CLUSTER GETKEYSINSLOT", self.slot, 1000))

    def migrate(self, keys: list[bytes]) -> None:
        if keys:
            self.src.execute_command("MIGRATE", "127.0.0.1", self.to_port, "", 0, 5000, "KEYS",
                                     *keys)

    def hand_over(self) -> None:
        """SETSLOT NODE on every primary; until every node agrees and the cluster is ok."""
        for client in self.masters:
            client.execute_command("CLUSTER SETSLOT", self.slot, "NODE", self.dst_id)
        wait_for(lambda: self.cluster.node_of(self.key) == self.to_port and self.cluster.ready(),
                 10, f"slot {self.slot} did not move")

class SentinelGroup:
    """A standalone primary on a loopback port, one replica of it, and ``sentinels``
    ``redis-sentinel`` processes watching it as master ``service`` (quorum: a majority), with
    ``down_after_ms`` (a primary silent that long is down) and ``failover_timeout_ms`` low, so a
    killed primary is failed over within a few seconds. ``url`` is the
    ``redis+sentinel://`` URL of the group; ``stop`` ends every process and removes every
    directory."""

    def __init__(self, service: str = "rl-primary", sentinels: int = 3,
                 down_after_ms: int = 500, failover_timeout_ms: int = 2000) -> None:
        self.service = service
        self.down_after_ms = down_after_ms
        self.failover_timeout_ms = failover_timeout_ms
        self.servers = [RedisServer(port=free_port(), extra=FAST_SYNC) for _ in range(2)]
        self.sentinel_ports = [free_port() for _ in range(sentinels)]
        self.sentinel_dirs: list[str] = []
        self.sentinel_procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{p}" for p in self.sentinel_ports)
        return f"redis+sentinel://{hosts}/{self.service}"

    def _sentinel_conf(self, folder: str, port: int, primary: int) -> str:
        path = os.path.join(folder, "sentinel.conf")
        with open(path, "w") as f:
            f.write(f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {folder}\n"
                    f"logfile {os.path.join(folder, 'sentinel.log')}\n"
                    f"sentinel monitor {self.service} 127.0.0.1 {primary} "
                    f"{len(self.sentinel_ports) // 2 + 1}\n"
                    f"sentinel down-after-milliseconds {self.service} {self.down_after_ms}\n"
                    f"sentinel failover-timeout {self.service} {self.failover_timeout_ms}\n"
                    f"sentinel parallel-syncs {self.service} 1\n")
        return path

    def start(self, timeout: float = 20.0) -> SentinelGroup:
        binary = shutil.which("redis-sentinel")
        if binary is None:
            raise FileNotFoundError("redis-sentinel is not installed (Debian redis-sentinel)")
        try:
            primary, replica = self.servers
            primary.start()
            replica.extra = (*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port))
            replica.start()
            env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
            for port in self.sentinel_ports:
                folder = tempfile.mkdtemp(prefix="rl-sentinel-")
                self.sentinel_dirs.append(folder)
                conf = self._sentinel_conf(folder, port, int(primary.port or 0))
                self.sentinel_procs.append(subprocess.Popen(
                    [binary, conf], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, env=env))
            wait_for(lambda: self.in_sync(primary) and all(
                self._sentinel(p).sentinel_master(self.service)["num-slaves"] >= 1
                and self._sentinel(p).sentinel_master(self.service)["num-other-sentinels"]
                == len(self.sentinel_ports) - 1 for p in self.sentinel_ports),
                timeout, "the Sentinels never saw the primary, its replica and each other")
        except BaseException:
            self.stop()
            raise
        return self

    def _sentinel(self, port: int) -> Any:
        import redis

        return redis.Redis(host="127.0.0.1", port=port, socket_timeout=1)

    def primary(self) -> RedisServer:
        """The server the Sentinels name master now."""
        for port in self.sentinel_ports:
            try:
                _, master = self._sentinel(port).sentinel_get_master_addr_by_name(self.service)
                return next(s for s in self.servers if s.port == int(master))
            except (OSError, LookupError, StopIteration, TypeError):
                continue
        raise LookupError("no Sentinel names a master")

    def in_sync(self, primary: RedisServer) -> bool:
        """``primary`` is a master with a replica past its initial sync (streaming)."""
        info = primary.client().info("replication")  # type: ignore[attr-defined]
        if info["role"] != "master" or int(info["connected_slaves"]) < 1:
            return False
        return bool(info["slave0"]["state"] == "online")

    def fail_over(self, timeout: float = 20.0) -> tuple[RedisServer, RedisServer]:
        """SIGKILL the primary and wait until the Sentinels name its replica and it answers
        as a master; (the server killed, the new primary)."""
        old = self.primary()
        old.kill()
        new = next(s for s in self.servers if s is not old)
        self.await_promotion(new, timeout)
        return old, new

    def await_promotion(self, new: RedisServer, timeout: float = 20.0) -> None:
        """Until every Sentinel names ``new`` master and it answers as one."""

        def promoted() -> bool:  # every Sentinel agrees: none turns the old one back later
            role = new.client().info("replication")["role"]  # type: ignore[attr-defined]
            return role == "master" and all(
                int(self._sentinel(p).sentinel_get_master_addr_by_name(self.service)[1])
                == new.port for p in self.sentinel_ports)

        wait_for(promoted, timeout, f"the Sentinels did not promote {new.port}")

    def rejoin(self, node: RedisServer, timeout: float = 20.0) -> None:
        """Restart a killed server as a replica of the current primary (what an operator, or
        the Sentinels once they see it, would make it); wait until it is in sync."""
        primary = self.primary()
        node.extra = (*FAST_SYNC, "--replicaof", "127.0.0.1", str(primary.port))
        node.start()
        wait_for(lambda: self.in_sync(primary), timeout, f"{node.port} did not catch up")

    def stop(self) -> None:
        for proc in self.sentinel_procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        for folder in self.sentinel_dirs:
            shutil.rmtree(folder, ignore_errors=True)
        for server in self.servers:
            server.stop()

    def __enter__(self) -> SentinelGroup:
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
