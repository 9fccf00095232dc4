"""Which process holds a lease: a pid and the process's start time, so that a pid the kernel
reused for another process is never taken for the lease holder (both backends' ``reap``, the
pool's supervisor)."""

from __future__ import annotations

import os
import socket

import psutil


def process_start_ms(pid: int | None = None) -> int:
    return int(psutil.Process(pid).create_time() * 1000)


def is_running(pid: int, start_ms: int) -> bool:
    """Whether process ``pid`` runs and is the one that started at ``start_ms`` (not a reuse)."""
    try:
        return abs(process_start_ms(pid) - start_ms) < 2000
    except Exception:  # psutil.NoSuchProcess, AccessDenied on a foreign pid
        return False


def host_owner_id(pid: int | None = None) -> str:
    """A lease owner id that names its host, ``host:pid:start_ms``: what a queue shared by
    hosts records (``is_running`` tells a live one on this host)."""
    pid = os.getpid() if pid is None else pid
    return f"{socket.gethostname()}:{pid}:{process_start_ms(pid)}"
