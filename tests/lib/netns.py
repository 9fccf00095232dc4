"""Hosts as Linux network namespaces, for the partition tests (a helper, not a test file).

``Hosts(n)`` makes ``n`` namespaces, each joined to the root namespace by a veth pair of its
own: the root end ``10.<net>.<k>.1/24`` (where a redis-server listens), the host's end
``10.<net>.<k>.2/24``, and no other route, so a host reaches the root namespace through its
link and nothing else. ``cut(k)`` sets the root end of host ``k``'s link down (its packets are
dropped, its TCP connections stay open and retransmit, as over a real partition), ``heal(k)``
sets it up again. ``command(k, argv)`` runs a program inside host ``k`` (``ip netns exec``;
the file system, /dev/shm and the pid space stay shared, so the test can watch and kill it).
``stop`` removes every namespace and link it made, whatever happened, and checks they are gone.

Needs root (``CAP_NET_ADMIN``) and ``ip``; :func:`unavailable` says why not when it cannot.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import uuid


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None: they can)."""
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add): run the partition tests as root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    return None


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], check=check, capture_output=True, text=True, timeout=30)


class Hosts:
    """``n`` network namespaces, each a host with one link to the root namespace."""

    def __init__(self, n: int) -> None:
        tag = uuid.uuid4().hex[:6]
        self.names = [f"rl-{tag}-{k}" for k in range(n)]
        self.links = [f"rl{tag}{k}" for k in range(n)]  # the root ends (<= 15 characters)
        self.net = random.randint(100, 250)

    def server_address(self, k: int) -> str:
        """The root namespace's address on host ``k``'s link (where host ``k`` finds Redis)."""
        return f"10.{self.net}.{k}.1"

    def address(self, k: int) -> str:
        return f"10.{self.net}.{k}.2"

    def start(self) -> Hosts:
        try:
            for k, (ns, link) in enumerate(zip(self.names, self.links, strict=True)):
                _ip("netns", "add", ns)
                _ip("link", "add", link, "type", "veth", "peer", "name", link + "h")
                _ip("link", "set", link + "h", "netns", ns)
                _ip("addr", "add", f"{self.server_address(k)}/24", "dev", link)
                _ip("link", "set", link, "up")
                _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", link + "h")
                _ip("-n", ns, "link", "set", link + "h", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
        except BaseException:
            self.stop()
            raise
        return self

    def command(self, k: int, argv: list[str]) -> list[str]:
        """``argv`` run inside host ``k``."""
        return ["ip", "netns", "exec", self.names[k], *argv]

    def cut(self, k: int) -> None:
        """Host ``k`` loses its link: nothing it sends arrives, nothing reaches it."""
        _ip("link", "set", self.links[k], "down")

    def heal(self, k: int) -> None:
        _ip("link", "set", self.links[k], "up")

    def leftovers(self) -> list[str]:
        """This object's namespaces and links that still exist."""
        spaces = set(_ip("netns", "list", check=False).stdout.split())
        links = _ip("-o", "link", "show", check=False).stdout
        return [n for n in self.names if n in spaces] + [n for n in self.links
                                                         if f" {n}@" in links or f" {n}:" in links]

    def stop(self) -> None:
        """Remove every link and namespace (a veth goes with either end; a namespace's own
        end goes with it)."""
        for link in self.links:
            _ip("link", "del", link, check=False)
        for ns in self.names:
            _ip("netns", "del", ns, check=False)
        left = self.leftovers()
        assert not left, f"could not remove {left}"

    def __enter__(self) -> Hosts:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
