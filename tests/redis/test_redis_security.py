"""Credentials and TLS on the Redis backend, against a real server: an ACL user limited to one
queue's keys runs a worker's whole cycle and is refused any other queue with an error that says
what it needs; a wrong password and an unknown CA are clear errors that never show the
password; ``rediss://`` with a private CA works end to end (docs/redis.md "ACL users")."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest
from lanes_testlib import HOUR, NOW
from redis_server import RedisServer, find_server, free_port

from engine import Engine, LanePolicy
from engine.errors import EngineError

pytestmark = pytest.mark.skipif(find_server() is None, reason="redis-server is not installed")

PASSWORD = "s3cret-Pw"
# The rules docs/redis.md gives for a worker's ACL user (the queue's keys; data commands, the
# transactions of stats/verify, the functions, INFO for the version check); FUNCTION LOAD and
# every @dangerous command are left out: the admin creates the queue and loads the library.
WORKER_RULES = ("-@all", "+@read", "+@write", "+@transaction", "-@dangerous", "+fcall",
                "+fcall_ro", "+info", "+ping", "+time")


def _name() -> str:
    return f"sec-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private CA and a server certificate for 127.0.0.1 signed by it (openssl)."""
    d = str(tmp_path_factory.mktemp("tls"))

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True, timeout=60)

    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
            "/CN=render-lanes test CA", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.pem")
    return d


@pytest.fixture(scope="module")
def tls_server(certs: str) -> Iterator[tuple[RedisServer, int]]:
    port = free_port()
    srv = RedisServer(extra=(
        "--tls-port", str(port), "--tls-cert-file", os.path.join(certs, "server.pem"),
        "--tls-key-file", os.path.join(certs, "server.key"),
        "--tls-ca-cert-file", os.path.join(certs, "ca.pem"), "--tls-auth-clients", "no"))
    srv.start()
    try:
        yield srv, port
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


def _worker_user(srv: RedisServer, user: str, queue: str) -> None:
    admin = srv.client()
    try:
        admin.execute_command("ACL", "SETUSER", user, "reset", "on", f">{PASSWORD}",  # type: ignore[attr-defined]
                              f"~lanes:{{{queue}}}:*", *WORKER_RULES)
    finally:
        admin.close()  # type: ignore[attr-defined]


def _keys(srv: RedisServer, pattern: str) -> list[bytes]:
    admin = srv.client()
    try:
        return list(admin.keys(pattern))  # type: ignore[attr-defined]
    finally:
        admin.close()  # type: ignore[attr-defined]


def test_an_acl_user_limited_to_its_queue_runs_a_workers_cycle(server: RedisServer) -> None:
    name = _name()
    with Engine.connect(server.unix_url, name, LanePolicy(), create=True) as admin:
        rows = [admin.add(NOW - HOUR, 3600) for _ in range(6)]
        _worker_user(server, "worker", name)
        url = f"unix://worker:{PASSWORD}@{server.socket}"
        with Engine.connect(url, name) as eng:
            batch = eng.claim(budget=4, now_ms=NOW)
            assert sorted(batch.rows.tolist()) == rows[:4]
            r, t = int(batch.rows[0]), int(batch.tokens[0])
            t = eng.renew(r, t, lease_ms=60_000, now_ms=NOW)
            eng.complete(r, t, now_ms=NOW)
            eng.fail(int(batch.rows[1]), int(batch.tokens[1]), now_ms=NOW)
            eng.release(int(batch.rows[2]), int(batch.tokens[2]))
            live, nxt = eng.complete_and_claim([int(batch.rows[3])], [int(batch.tokens[3])],
                                               budget=16, now_ms=NOW)
            assert live.tolist() == [True]
            assert sorted(nxt.rows.tolist()) == sorted(rows[2:3] + rows[4:])
            assert eng.due_ms(r) == NOW + 3600 * 1000
            assert eng.stats()["rows"] == 6
            assert eng.verify() == []
        admin.drop()


def test_an_acl_user_is_refused_another_queue_saying_what_it_needs(server: RedisServer) -> None:
    mine, other = _name(), _name()
    with Engine.connect(server.unix_url, other, create=True) as admin:
        admin.add(NOW - HOUR, 3600)
        _worker_user(server, "narrow", mine)
        url = f"unix://narrow:{PASSWORD}@{server.socket}"
        for create in (False, True):
            with pytest.raises(EngineError) as info:
                Engine.connect(url, other, create=create)
            text = str(info.value)
            assert "no permissions" in text and f"~lanes:{{{other}}}:*" in text
            assert PASSWORD not in text
        with pytest.raises(EngineError, match="no permissions"):
            Engine.connect(url, _name(), create=True)  # creating any other queue: refused too
        assert admin.stats()["rows"] == 1 and admin.verify() == []
        admin.drop()
    assert _keys(server, "lanes:{sec-*") == []  # the refused creates wrote nothing


def test_a_wrong_password_is_a_clear_error_without_the_password(server: RedisServer) -> None:
    name = _name()
    _worker_user(server, "someone", name)
    url = f"unix://someone:not-{PASSWORD}@{server.socket}"
    with pytest.raises(EngineError) as info:
        Engine.connect(url, name, create=True, timeout=0.5)
    text = str(info.value)
    assert "someone:***@" in text and "invalid username-password" in text.lower()
    assert PASSWORD not in text


def test_tls_with_a_private_ca_and_an_acl_user(tls_server: tuple[RedisServer, int],
                                               certs: str) -> None:
    srv, port = tls_server
    name = _name()
    _worker_user(srv, "tls-worker", name)
    with Engine.connect(srv.unix_url, name, create=True) as admin:  # the admin, over the socket
        row = admin.add(NOW - HOUR, 3600)
        ca = os.path.join(certs, "ca.pem")
        url = f"rediss://tls-worker:{PASSWORD}@127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        with Engine.connect(url, name) as eng:
            batch = eng.claim(budget=2, now_ms=NOW)
            assert batch.rows.tolist() == [row]
            eng.complete(row, int(batch.tokens[0]), now_ms=NOW)
        assert admin.due_ms(row) == NOW + 3600 * 1000
        # A client that does not trust the CA is refused the connection, and says so.
        with pytest.raises(EngineError) as info:
            Engine.connect(f"rediss://tls-worker:{PASSWORD}@127.0.0.1:{port}/0", name,
                           timeout=0.5)
        assert "certificate" in str(info.value).lower() and PASSWORD not in str(info.value)
        # Plain redis:// against the TLS port is not a silent hang either.
        with pytest.raises(EngineError):
            Engine.connect(f"redis://tls-worker:{PASSWORD}@127.0.0.1:{port}/0", name,
                           timeout=0.5)
        admin.drop()
