"""Politeness to the sites a pool renders, across all its worker processes: ``<engine>.hosts``.

A pool's workers are separate processes (fork, spawn or forkserver), and any of them may be
SIGKILLed at any moment. Two promises must hold across all of them:

* ``per_host`` N: at most N renders in flight to one host (``host:port``);
* ``delay_ms`` D: at least D ms between the starts of two renders to one host.

The race this prevents: two workers that each see "one slot left" and both start. The hazard it
must survive: a worker that dies holding a slot, which would leave it taken for ever if slots
were counters in shared memory (a dead process cannot decrement anything). So a slot is not a
counter but a byte-range lock that the *kernel* owns for us and drops when its holder dies.

Design
------
A host hashes (blake2b of the normalised ``host:port``, stable across processes, unlike
``hash()``) to one of ``BUCKETS`` buckets. The file ``/dev/shm/<engine>.hosts`` holds::

    0                    header (64 bytes): "RLHOSTS1", version, buckets, per_host (0: none),
                         delay_ms
    HEADER + 8*b         bucket b's "next start allowed at" (int64 ms); lock on its 8 bytes
    slot_base + N*b + k  slot k of bucket b: a one-byte lock range past the end of the file
                         (slot_base = the file's size, HEADER + 8*B)

* Taking a slot = a non-blocking exclusive lock on one of the bucket's N slot bytes, tried in a
  rotating order from a per-process start; giving it back = unlocking it. The kernel is the only
  counter, so a holder's death frees its slot with no cleanup by anyone.
* The delay: with the slot taken, a non-blocking lock on the 8 bytes of the bucket's word guards
  its read-modify-write: refused if ``now < next``, else ``next = now + D``. If that lock is
  busy, another process is starting a render to this host at this very moment, so this one
  would be refused anyway and is refused at once: nothing here ever blocks or waits.
* Order: slot first, then the delay word, so the word only moves for a start that happens (a
  start refused by the delay gives its slot back).

Collisions: two hosts in one bucket share its N slots and its delay word, which is stricter
than asked (they may wait for each other), never looser. With 4096 buckets, a pool crawling
``h`` hosts at once puts a given host beside another one with probability about ``h / 4096``.

Why open-file-description locks (``F_OFD_SETLK``, Linux >= 3.15), not POSIX ``lockf``
-----------------------------------------------------------------------------------------
Classic POSIX record locks belong to the *process*: every ``close()`` of *any* descriptor of the
file drops *all* of the process's locks on it (a second attach, a stats reader, a gate inherited
over fork and closed later, would silently free slots in use), and all threads of a process are
one owner. OFD locks belong to the open file description that one ``attach`` makes, so:

* closing another descriptor of the file drops nothing;
* two gates in one process are two owners and exclude each other like two processes (the
  single-process tests use that); one gate is shared safely by threads (a mutex serialises it,
  and it never re-takes a byte it holds itself, which the kernel would allow its own owner);
* the locks go when the last descriptor of that description closes: at the holder's death.

The one catch of OFD locks is ``fork``: the child shares the parent's open file description, so
the parent's slots would live on after the parent's death while the child keeps the descriptor.
Hence the descriptor is ``O_CLOEXEC`` (gone at ``exec``) and an ``os.register_at_fork`` hook
closes every gate's descriptor in a forked child and disables the inherited gate: a child must
``HostGate.attach(name)`` its own. The pool's workers attach by name anyway, under every start
method.

Time: by default the gate reads ``CLOCK_MONOTONIC`` (one clock for every process of the
machine, never stepped) *under the bucket's delay lock*, so the starts of one host are ordered
as their times: a caller descheduled between reading a clock and taking the lock cannot start
"before" the last start. ``now_ms`` lets tests pass a time; production callers should pass
None (a time read earlier can be stale by a scheduling delay, and the pool's virtual clock at
``time_scale`` > 1 would shrink real delays). A word more than one delay plus an hour ahead of
``now`` cannot come from the caller's clock (a wall clock stepped back, a caller using another
clock) and is overwritten rather than obeyed for ever.

With ``per_host=None`` and ``delay_ms=0`` the gate admits everything at once, with no hashing,
locking or parsing: a pool that did not ask for politeness pays nothing.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import struct
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Final, final
from urllib.parse import urlsplit

from .. import shmfile
from ..checks import is_int
from ..errors import EngineClosed, EngineError, EngineValueError, LayoutMismatch

SUFFIX: Final = "hosts"
BUCKETS: Final = 4096
"""Hosts hash to this many buckets; two hosts in one bucket share its slots and its delay."""
MAX_PER_HOST: Final = 1000
MAX_DELAY_MS: Final = 3_600_000

_MAGIC: Final = b"RLHOSTS1"
_VERSION: Final = 1  # bump with any change of the header, the word area or the lock offsets
_HEADER = struct.Struct("<8sqqqq")  # magic, version, buckets, per_host (0: no cap), delay_ms
HEADER: Final = 64  # bytes; the words start here, 8-byte aligned
_FLOCK = struct.Struct("@hhqqi0q")  # struct flock (64-bit off_t): type, whence, start, len, pid
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}
_FOREIGN_MS: Final = MAX_DELAY_MS
"""A next start more than one delay plus this ahead of ``now`` was not written on its clock."""


@final
@dataclass(frozen=True, eq=False)
class Ticket:
    """One admitted render: hand it back with ``HostGate.leave`` when the render ends."""

    host: str
    bucket: int  # -1: the gate admits everything (no slot, no delay)
    slot: int  # -1: no per-host cap, so no slot is held
    at_ms: int  # the start time the gate admitted (its clock, see the module note); 0 if free


_FREE: Final = Ticket("", -1, -1, 0)

_open_gates: weakref.WeakSet[HostGate] = weakref.WeakSet()


@final
class HostGate:
    """The per-host cap and delay of one pool, shared by name: one per process (see above)."""

    def __init__(self, name: str, buf: mmap.mmap, fd: int) -> None:
        magic, version, buckets, per_host, delay_ms = _HEADER.unpack_from(buf, 0)
        if magic != _MAGIC or version != _VERSION:
            raise LayoutMismatch(f"{name}.{SUFFIX} is not a render-lanes host gate "
                                 "(or another version)")
        if (not 1 <= buckets <= 1 << 20 or len(buf) != HEADER + 8 * buckets
                or not 0 <= per_host <= MAX_PER_HOST or not 0 <= delay_ms <= MAX_DELAY_MS):
            raise LayoutMismatch(f"{name}.{SUFFIX} has another layout")
        self.name = name
        self.buckets: int = buckets
        self.per_host: int | None = per_host or None
        self.delay_ms: int = delay_ms
        self._free = not per_host and not delay_ms
        self._buf = buf
        self._fd = fd  # our own open file description: the owner of every lock we hold
        self._pid = os.getpid()
        self._bytes = memoryview(buf)
        self._next = self._bytes[HEADER:].cast("q")  # bucket b's next start allowed (ms)
        self._slot_base = len(buf)  # slot bytes lie past the end of the file
        self._mutex = threading.Lock()  # serialises threads sharing this gate
        self._held: dict[int, Ticket] = {}  # slot byte offset -> the ticket holding it
        self._turn = self._pid  # rotates the first slot tried, differently in each process
        self._closed = False
        self._admitted = self._refused_full = self._refused_delay = 0
        _open_gates.add(self)

    # -- the file --------------------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, per_host: int | None, delay_ms: int = 0) -> HostGate:
        """Write ``<name>.hosts`` (the supervisor; never replaces one) and attach to it."""
        cls.check_limits(per_host, delay_ms)
        header = _HEADER.pack(_MAGIC, _VERSION, BUCKETS, per_host or 0, delay_ms)
        shmfile.create(_checked(name), SUFFIX, header, HEADER + 8 * BUCKETS)
        return cls.attach(name)

    @staticmethod
    def check_limits(per_host: int | None, delay_ms: int) -> None:
        """``EngineValueError`` unless ``per_host`` and ``delay_ms`` are limits a gate takes."""
        if per_host is not None and (not is_int(per_host) or not 1 <= per_host <= MAX_PER_HOST):
            raise EngineValueError(f"per_host must be None or an int in [1, {MAX_PER_HOST}], "
                                   f"got {per_host!r}")
        if not is_int(delay_ms) or not 0 <= delay_ms <= MAX_DELAY_MS:
            raise EngineValueError(f"delay_ms must be an int in [0, {MAX_DELAY_MS}], "
                                   f"got {delay_ms!r}")

    @classmethod
    def attach(cls, name: str) -> HostGate:
        """Open ``<name>.hosts`` (each worker, once: its own lock owner); limits from the file."""
        buf = shmfile.attach(_checked(name), SUFFIX, writable=True, min_size=HEADER)
        try:
            fd = os.open(shmfile.path_of(name, SUFFIX), os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            buf.close()
            raise LayoutMismatch(f"{name}.{SUFFIX} vanished while attaching") from None
        try:
            return cls(name, buf, fd)
        except BaseException:
            os.close(fd)
            buf.close()
            raise

    @staticmethod
    def unlink(name: str) -> bool:
        """Remove ``<name>.hosts``; False if it was not there. Attached gates keep working."""
        return shmfile.unlink(name, SUFFIX)

    def close(self) -> None:
        """Detach; every slot this gate still holds is given back (the kernel drops its locks)."""
        if self._pid != os.getpid():
            return  # inherited over fork: already let go of (and its mutex may be held for ever)
        with self._mutex:
            if self._closed:
                return
            self._closed = True
            self._held.clear()
            os.close(self._fd)
            self._release_map()
        _open_gates.discard(self)

    def __enter__(self) -> HostGate:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- admission -------------------------------------------------------------------------------

    @staticmethod
    def host_of(url: str) -> str:
        """The host as the gate counts it: lowercased ``host:port``, default port filled in.

        ``http://Example.COM./a`` and ``http://example.com:80/b`` are one host; an IDN and its
        punycode are one host; ``http`` and ``https`` of one name are two (ports 80, 443).
        """
        try:
            parts = urlsplit(url)
            port = parts.port
        except (ValueError, TypeError, AttributeError):
            raise EngineValueError(f"{url!r} is not a URL the host gate can read") from None
        host = (parts.hostname or "").rstrip(".")  # urlsplit lowercases it
        if not host:
            raise EngineValueError(f"{url!r} has no host")
        if not host.isascii():
            try:
                host = host.encode("idna").decode("ascii")
            except UnicodeError:
                pass  # not a name IDNA 2003 can encode: counted as written
        if port is None:
            port = _DEFAULT_PORTS.get(parts.scheme.lower())
        if ":" in host:
            host = f"[{host}]"  # an IPv6 address
        return host if port is None else f"{host}:{port}"

    def bucket_of(self, host: str) -> int:
        """The bucket of a host as ``host_of`` gives it (stable across processes and runs)."""
        digest = hashlib.blake2b(host.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return int.from_bytes(digest, "little") % self.buckets

    def try_enter(self, url: str, now_ms: int | None = None) -> Ticket | None:
        """A ticket to start rendering ``url`` now, or None: the host is full or its delay is
        not over (leave the row for later). Never blocks. ``now_ms``: see the module note
        (None in production)."""
        if self._free:
            return _FREE
        host = self.host_of(url)
        bucket = self.bucket_of(host)
        with self._mutex:
            self._check_usable()
            slot = -1
            if self.per_host is not None:
                slot = self._take_slot(bucket)
                if slot < 0:
                    self._refused_full += 1
                    return None
            at = self._start_after_delay(bucket, now_ms) if self.delay_ms else _now(now_ms)
            if at is None:
                if slot >= 0:
                    self._unlock(self._slot_at(bucket, slot), 1)
                self._refused_delay += 1
                return None
            ticket = Ticket(host, bucket, slot, at)
            if slot >= 0:
                self._held[self._slot_at(bucket, slot)] = ticket
            self._admitted += 1
            return ticket

    def leave(self, ticket: Ticket) -> None:
        """Give the ticket's slot back. A ticket left twice, or not this gate's, is ignored."""
        if ticket.slot < 0:
            return
        with self._mutex:
            at = self._slot_at(ticket.bucket, ticket.slot)
            if self._closed or self._held.get(at) is not ticket:
                return
            del self._held[at]
            self._unlock(at, 1)

    # -- looking at it ---------------------------------------------------------------------------

    def in_flight(self, url: str) -> int:
        """Slots taken now in ``url``'s bucket, by every process (this gate's own included).

        A snapshot, for tests and views; 0 when the gate has no per-host cap."""
        if self.per_host is None:
            return 0
        bucket = self.bucket_of(self.host_of(url))
        with self._mutex:
            self._check_usable()
            start = pos = self._slot_at(bucket, 0)
            end = start + self.per_host
            taken = sum(1 for at in self._held if start <= at < end)
            while pos < end:  # the kernel reports one conflicting lock at a time (ours never)
                got = fcntl.fcntl(self._fd, fcntl.F_OFD_GETLK,
                                  _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, pos, end - pos, 0))
                kind, _, at, length, _ = _FLOCK.unpack(got)
                if kind == fcntl.F_UNLCK:
                    break
                stop = end if length == 0 else min(end, at + length)
                taken += stop - max(at, pos)
                pos = stop
            return taken

    def statistics(self) -> dict[str, Any]:
        """This gate's limits and counters (this process's admissions and refusals)."""
        return {"name": self.name, "per_host": self.per_host, "delay_ms": self.delay_ms,
                "buckets": self.buckets, "held": len(self._held), "admitted": self._admitted,
                "refused_full": self._refused_full, "refused_delay": self._refused_delay,
                "closed": self._closed}

    # -- inside ----------------------------------------------------------------------------------

    def _slot_at(self, bucket: int, slot: int) -> int:
        assert self.per_host is not None
        return self._slot_base + bucket * self.per_host + slot

    def _take_slot(self, bucket: int) -> int:
        """Lock a free slot byte of ``bucket``; its index, or -1 if all N are taken."""
        assert self.per_host is not None
        n = self.per_host
        first = self._turn % n
        self._turn += 1
        for i in range(n):
            slot = (first + i) % n
            at = self._slot_at(bucket, slot)
            # The kernel lets an owner re-lock its own byte: ours are skipped, not re-taken.
            if at not in self._held and self._lock(at, 1):
                return slot
        return -1

    def _start_after_delay(self, bucket: int, now_ms: int | None) -> int | None:
        """Move the bucket's next start to ``now + D`` and return ``now`` if it may start."""
        at = HEADER + 8 * bucket
        if not self._lock(at, 8):
            return None  # another process is starting a render to this host right now
        try:
            # Read under the lock: starts are then ordered as their times, and a caller that
            # was descheduled before the lock cannot start "in the past" of the last start.
            now = _now(now_ms)
            nxt = self._next[bucket]
            if nxt - now > self.delay_ms + _FOREIGN_MS:
                nxt = 0  # not written on the caller's clock: overwritten, not obeyed for ever
            if now < nxt:
                return None
            self._next[bucket] = now + self.delay_ms
            return now
        finally:
            self._unlock(at, 8)

    def _lock(self, start: int, length: int) -> bool:
        """A non-blocking exclusive OFD lock; False if another owner holds part of the range."""
        try:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK,
                        _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, start, length, 0))
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise EngineError(f"cannot lock {self.name}.{SUFFIX}: {e}") from None
        return True

    def _unlock(self, start: int, length: int) -> None:
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK,
                    _FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, start, length, 0))

    def _check_usable(self) -> None:
        if self._pid != os.getpid():
            raise EngineError(f"the host gate {self.name!r} was attached by pid {self._pid}; "
                              "a forked child must attach its own (HostGate.attach)")
        if self._closed:
            raise EngineClosed(f"the host gate {self.name!r} is closed")

    def _release_map(self) -> None:
        self._next.release()
        self._bytes.release()
        self._buf.close()

    def _forget_after_fork(self) -> None:
        # In a forked child: drop our reference to the parent's open file description, so the
        # parent's slots die with the parent. No mutex: another thread may have held it at fork.
        if not self._closed:
            self._closed = True
            self._held = {}
            os.close(self._fd)


def _now(now_ms: int | None) -> int:
    return time.monotonic_ns() // 1_000_000 if now_ms is None else now_ms


def _checked(name: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or "\0" in name:
        raise EngineValueError(f"bad pool name {name!r}")
    return name


def _after_fork_in_child() -> None:
    for gate in list(_open_gates):
        gate._forget_after_fork()


os.register_at_fork(after_in_child=_after_fork_in_child)
