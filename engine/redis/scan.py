"""A queue read by chunks: what ``verify`` and ``save`` read of a queue too big for one reply.

Why: a reply is built whole in the server's memory before it is sent (a 10M-row ready ZSET read
with one ZRANGE is hundreds of MB of output buffer, and GBs of Python objects on the client),
and a MULTI/EXEC of such reads blocks every other client for as long as it runs. So a queue is
read in bounded steps, none of which blocks the server for long: the row table by ``GETRANGE``
windows, ready, lease and holder by ``ZSCAN``/``HSCAN`` cursors (``count`` entries a step;
ready's through ``lanes_scan``, which packs a step as two strings). The client keeps the row
table (6 bytes a row) and numpy arrays of a few bytes per row, never a Python object per row;
the server never holds more than one step's reply.

What a read by chunks sees under writes (docs/redis.md "Big queues"): a SCAN cursor returns
every entry present for the whole scan at least once, and may return an entry that came or
went meanwhile, or return one twice. So each row's parts are each seen at some moment during
the read, not all at one moment. ``verify`` therefore reads again, in one MULTI/EXEC, the rows
its walk found something wrong with (:meth:`QueueScan.snapshot`), and reports only what that
snapshot confirms. ``export_rows`` reads again, in one MULTI/EXEC per chunk, the live rows it
found no key for (a row that moved between ready and flight behind both cursors).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from ..keys import STRIDE
from .codec import LIVE, MAX_LANES, RECORD, QueueParts, flags, holding, member, text_map
from .transport import Transport

SCAN_COUNT = 5_000
"""Entries a SCAN step asks for (a hint the server may exceed a little): a few ms of the
server's time a step."""
TABLE_CHUNK = 100_000
"""Records per GETRANGE of the row table (600 kB)."""
RECHECK = 10_000
"""Rows read again in one MULTI/EXEC at most (``snapshot``, ``keys_of``)."""


class QueueScan:
    """Chunked reads of the queue whose keys are ``keys`` (ready, lease, rows, meta, holder)."""

    def __init__(self, transport: Transport, keys: tuple[str, str, str, str, str],
                 count: int = SCAN_COUNT) -> None:
        self.t, self.keys, self.count = transport, keys, count

    def _read(self, command: str, *args: Any, **kw: Any) -> Any:
        """One read step (retried on a lost connection, as every read)."""
        return self.t.call(command.upper(), lambda r: getattr(r, command)(*args, **kw))

    def meta(self) -> dict[str, str]:
        return text_map(self._read("hgetall", self.keys[3]))

    def table(self, n: int) -> bytearray | None:
        """The row table's records of rows below ``n`` (``RECORD`` bytes each), by GETRANGE
        windows into one buffer; None when the table holds fewer."""
        key = self.keys[2]
        out = bytearray(n * RECORD)
        for start in range(0, n * RECORD, TABLE_CHUNK * RECORD):
            stop = min(n * RECORD, start + TABLE_CHUNK * RECORD)
            raw = self._read("getrange", key, start, stop - 1)
            if len(raw) != stop - start:
                return None
            out[start:stop] = raw
        return out

    def ready(self) -> Iterator[tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]]:
        """(rows, keys) of the ready ZSET, a SCAN step at a time (``lanes_scan``: a step's
        members and scores come as two strings, parsed here by numpy, not per element)."""
        cursor = b"0"
        while True:
            cursor, members, keys = self._read(
                "fcall_ro", "lanes_scan", 5, *self.keys, self.t.version, cursor, self.count)
            if members:
                yield (np.frombuffer(members, "S8").astype(np.int64),
                       np.array(keys.split(b" ")).astype(np.float64).astype(np.int64))
            if cursor == b"0":
                return

    def lease(self) -> dict[str, int]:
        """The batches in flight (a pool's, not the queue's) and their expiries."""
        out: dict[str, int] = {}
        cursor = 0
        while True:
            cursor, got = self._read("zscan", self.keys[1], cursor, count=self.count)
            out.update((b.decode(), int(e)) for b, e in got)
            if cursor == 0:
                return out

    def holder(self) -> dict[bytes, bytes]:
        """The holder hash (rows in flight and batch records: a pool's in-flight, not the
        queue), a SCAN step at a time."""
        out: dict[bytes, bytes] = {}
        cursor = 0
        while True:
            cursor, got = self._read("hscan", self.keys[4], cursor, count=self.count)
            out.update(got)
            if cursor == 0:
                return out

    # -- verify ----------------------------------------------------------------------------------

    def parts(self) -> QueueParts | str | None:
        """The queue read by chunks for ``codec.verify``; None when it does not exist, a
        problem's text when its row table is short."""
        meta = self.meta()
        if not meta:
            return None
        n = int(meta["next_row"])
        table = self.table(n)
        if table is None:
            return f"row table holds fewer records than next_row {n}"
        in_ready = np.zeros(n, np.bool_)
        far: list[int] = []
        past: list[tuple[str, int]] = []
        for rows, keys in self.ready():
            inside = rows < n
            in_ready[rows[inside]] = True
            past += [("ready", r) for r in rows[~inside].tolist()]
            far += rows[keys // STRIDE >= MAX_LANES].tolist()
        lease = self.lease()
        return QueueParts(n, int(meta["token"]), (flags(table) & LIVE) != 0, in_ready, lease,
                          self.holder(), far, past)

    def snapshot(self, look: list[int]) -> QueueParts | None:
        """The parts of rows ``look`` (sorted; ``RECHECK`` of them at most, to keep the reply
        small), with lease and holder whole, read in one MULTI/EXEC: what ``verify`` confirms
        its findings with."""
        ready, lease, table, meta, holder = self.keys
        members = [member(r) for r in look] or ["00000000"]
        fields = [a for r in look for a in ("GET", "u48", f"#{r}")] or ["GET", "u48", "#0"]
        meta_all, scores, recs, in_lease, held = self.t.snapshot(
            ("hgetall", (meta,)), ("zmscore", (ready, members)),
            ("execute_command", ("BITFIELD_RO", table, *fields)),
            ("zrange", (lease, 0, -1, False, True)), ("hgetall", (holder,)))
        if not meta_all:
            return None
        m = text_map(meta_all)
        n = int(m["next_row"])
        size = max(n, look[-1] + 1 if look else 0)
        live = np.zeros(size, np.bool_)
        in_ready = np.zeros(size, np.bool_)
        only = np.zeros(size, np.bool_)
        far, past = [], []
        for r, score, rec in zip(look, scores, recs, strict=False):
            only[r] = True
            live[r] = bool(int(rec) & LIVE)
            if score is not None:
                in_ready[r] = True
                far += [r] if int(score) // STRIDE >= MAX_LANES else []
                past += [("ready", r)] if r >= n else []
        return QueueParts(n, int(m["token"]), live[:n], in_ready[:n],
                          {b.decode(): int(e) for b, e in in_lease}, held, far, past, only[:n])

    # -- export ----------------------------------------------------------------------------------

    def keys_of(self, n: int, live: npt.NDArray[np.bool_]) -> npt.NDArray[np.int64]:
        """Each live row's key (-1: none found): its ready score, or the key its holder entry
        keeps while it is in flight; rows missed by both cursors read again."""
        key = np.full(n, -1, np.int64)
        for rows, scores in self.ready():
            inside = rows < n
            key[rows[inside]] = scores[inside]
        lease = self.lease()
        for field, value in self.holder().items():
            if field[:1] == b"b":
                continue
            row, h = int(field), holding(value)
            if row < n and key[row] < 0 and h.batch in lease:
                key[row] = h.key
        missing = np.flatnonzero(live & (key < 0)).tolist()
        for start in range(0, len(missing), RECHECK):
            self._keys_again(missing[start:start + RECHECK], key)
        return key

    def _keys_again(self, rows: list[int], key: npt.NDArray[np.int64]) -> None:
        """``rows``' keys read in one MULTI/EXEC (ready, or in flight under a batch in lease)."""
        ready, lease, _table, _meta, holder = self.keys
        members = [member(r) for r in rows]
        scores, held, batches = self.t.snapshot(
            ("zmscore", (ready, members)), ("hmget", (holder, members)),
            ("zrange", (lease, 0, -1)))
        flying = {b.decode() for b in batches}
        for r, score, value in zip(rows, scores, held, strict=True):
            if score is not None:
                key[r] = int(score)
            elif value is not None and (h := holding(value)).batch in flying:
                key[r] = h.key
