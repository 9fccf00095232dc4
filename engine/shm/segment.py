"""The thin binding layer: one process's handle on a segment, C statuses turned into exceptions
(:func:`raise_for`, the one table from a C status to the exception hierarchy: a new code in
``csrc/lanes.h`` needs one line there).

Why a handle of our own rather than ``multiprocessing.shared_memory.SharedMemory``: before 3.13
every ``SharedMemory(name)`` registers the segment with the resource tracker, which unlinks it
when the *attaching* process exits — taking the owner's queue with it. The C core opens the
same ``/dev/shm`` object with ``shm_open`` directly, so no tracker ever hears of it and only the
creator (or ``lanes cleanup``) unlinks.

Lease owners are per process: after ``os.fork()`` the child registers itself on first use, so
the parent's leases stay the parent's. The owner's start time (psutil) is recorded beside its
pid, so ``Engine.reap`` never mistakes a reused pid for the owner.
"""

from __future__ import annotations

import os
import threading
from typing import Any, NoReturn

from .. import _core
from ..errors import (
    AttachTimeout,
    CapacityError,
    EngineClosed,
    EngineError,
    EngineValueError,
    LayoutMismatch,
    LeaseLost,
    NotAllowed,
    SegmentExists,
    SegmentMissing,
)
from ..policy import INTERVALS, REMAINDERS, SHARE_CLASSES, LanePolicy, share_fp
from ..process import process_start_ms

ffi = _core.ffi
lib = _core.lib

OWNER_FREE, OWNER_CLAIMING, OWNER_ALIVE, OWNER_DEAD = 0, 1, 2, 3

def owner_state(word: int) -> int:
    """The RL_OWNER_* state in an owner state word ([registration:32][state:32])."""
    return word & 0xFFFFFFFF


# Bumped in every forked child, so a handle can tell "same process" without calling getpid()
# on the claim path.
_fork_generation = [0]


def _after_fork_in_child() -> None:
    _fork_generation[0] += 1


os.register_at_fork(after_in_child=_after_fork_in_child)

# One registration at a time per process (threads that first use an engine together would
# otherwise register two owners through one handle). Keyed by pid: a forked child must not
# inherit a lock another thread of its parent held at the fork.
_registering: dict[int, threading.Lock] = {}
CLASS_INDEX = {"urgent": 0, "submitted": 1, "discovered": 2, "cold": 3}


# Status codes from csrc/lanes.h, by their names there (a renumbered code cannot drift).
_TABLE: dict[int, tuple[type[EngineError], str]] = {
    lib.RL_E_LAYOUT: (LayoutMismatch, "segment layout does not match"),
    lib.RL_E_LEASE: (LeaseLost, "lease lost: the token is stale"),
    lib.RL_E_CAPACITY: (CapacityError, "capacity exhausted"),
    lib.RL_E_VALUE: (EngineValueError, "bad argument"),
    lib.RL_E_RANGE: (EngineValueError,
                    "out of range (a row id that does not exist, or a value past its limit)"),
    lib.RL_E_SYS: (EngineError, "system call failed"),
    lib.RL_E_TIMEOUT: (AttachTimeout, "timed out waiting for the segment"),
    lib.RL_E_EXISTS: (SegmentExists, "segment already exists"),
    lib.RL_E_NOTFOUND: (SegmentMissing, "no such segment"),
    lib.RL_E_NOTALLOWED: (NotAllowed, "not allowed now"),
    lib.RL_E_BUSY: (EngineError, "busy"),
}


def raise_for(status: int, context: str = "") -> NoReturn:
    """Raise the exception mapped to a negative C status, with ``context`` in the message."""
    cls, text = _TABLE.get(status, (EngineError, f"unknown status {status}"))
    raise cls(f"{context}: {text}" if context else text)


def check(status: int, context: str = "") -> int:
    """Pass a non-negative status through; raise the mapped exception for a negative one."""
    if status < 0:
        raise_for(status, context)
    return status


def policy_to_c(policy: LanePolicy) -> Any:
    p = ffi.new("rl_policy *")
    p.band_count = len(policy.ttl_bands)
    for i, b in enumerate(policy.ttl_bands):
        p.bands[i] = min(b, 0xFFFFFFFF)
    p.cold_after = policy.cold_after
    p.urgent_share = share_fp(policy.urgent_max_share)
    p.urgent_share_exact = policy.urgent_max_share
    for name in SHARE_CLASSES:
        share = policy.min_share.get(name, 0.0)
        p.min_share[CLASS_INDEX[name]] = share_fp(share)
        p.min_share_exact[CLASS_INDEX[name]] = share
    p.remainder = REMAINDERS.index(policy.remainder)  # RL_REMAINDER_*, in the same order
    p.lanes_enabled = 1 if policy.lanes_enabled else 0
    p.weights_live = 1 if policy.live_weights else 0
    given = {} if isinstance(policy.weights, str) else policy.weights
    weights = policy.lane_weights_fp(lib.RL_MAX_LANES, [(0, 0)] * lib.RL_MAX_LANES)
    for lane, name in enumerate(policy.lane_names(lib.RL_MAX_LANES)):
        p.weight[lane] = weights[lane]  # derived weights: RL_ONE, unread
        p.weight_exact[lane] = given.get(name, 1.0)
    return p


def policy_from_c(p: Any) -> LanePolicy:
    bands = tuple(int(p.bands[i]) for i in range(p.band_count))
    names = LanePolicy(ttl_bands=bands).lane_names(lib.RL_MAX_LANES)
    shares = {n: float(p.min_share_exact[CLASS_INDEX[n]]) for n in SHARE_CLASSES
              if p.min_share[CLASS_INDEX[n]] > 0}
    return LanePolicy(
        ttl_bands=bands,
        cold_after=int(p.cold_after),
        urgent_max_share=float(p.urgent_share_exact),
        min_share=shares,
        remainder=REMAINDERS[p.remainder],
        lanes_enabled=bool(p.lanes_enabled),
        weights=INTERVALS if p.weights_live else {
            name: float(p.weight_exact[lane]) for lane, name in enumerate(names)
            if lane < len(names) and p.weight_exact[lane] != 1.0},
    )


class Segment:
    """A mapped segment plus this process's lease-owner id. Not thread-safe; one per process."""

    def __init__(self, handle: Any, name: str) -> None:
        self._handle = handle
        self.name = name
        self._owner = 0
        self._owner_pid = -1
        self._owner_gen = -1
        self._policy_version = -1
        self._policy: LanePolicy | None = None
        self._mapped_pid = os.getpid()  # the process whose page tables map the segment
        # The request block of the engine's hot calls (csrc/lanes.h rl_req): handle and owner,
        # bound per process by Engine._bind. Closing empties it first, so engine._hot never
        # passes a freed handle to the core.
        self.request: Any = ffi.new("rl_req *")

    @classmethod
    def create(cls, name: str, capacity: int, ring_capacity: int, policy: LanePolicy,
               now_ms: int) -> Segment:
        out = ffi.new("rl_seg **")
        check(lib.rl_create(name.encode(), capacity, ring_capacity, policy_to_c(policy), now_ms,
                            out), f"create {name!r}")
        return cls(out[0], name)

    @classmethod
    def attach(cls, name: str, timeout: float) -> Segment:
        out = ffi.new("rl_seg **")
        check(lib.rl_attach(name.encode(), timeout, out), f"attach {name!r}")
        return cls(out[0], name)

    @property
    def handle(self) -> Any:
        if self._handle is None:
            raise EngineClosed(f"engine {self.name!r} is closed")
        return self._handle

    @property
    def owner(self) -> int:
        """This process's lease-owner id, registered on first use (again after a fork)."""
        if self._owner_gen == _fork_generation[0]:
            return self._owner
        pid = os.getpid()
        with _registering.setdefault(pid, threading.Lock()):
            return self._register(pid)

    def _register(self, pid: int) -> int:
        if self._owner_gen == _fork_generation[0]:
            return self._owner  # another thread registered meanwhile
        if self._mapped_pid != pid:
            # A forked child shares the mapping but not its page tables: map the pages now
            # rather than one fault per page on the claim path (rl_attach does this too).
            lib.rl_prefault(self.handle)
            self._mapped_pid = pid
        if self._owner_pid != pid:
            out = ffi.new("uint32_t *")
            check(lib.rl_owner_register(self.handle, pid, process_start_ms(pid), out),
                  "register lease owner")
            self._owner, self._owner_pid = int(out[0]), pid
        self._owner_gen = _fork_generation[0]
        return self._owner

    def info(self) -> Any:
        out = ffi.new("rl_info *")
        check(lib.rl_info_get(self.handle, out))
        return out

    def policy(self) -> LanePolicy:
        p = ffi.new("rl_policy *")
        version = ffi.new("uint64_t *")
        check(lib.rl_policy_get(self.handle, p, version))
        if version[0] != self._policy_version or self._policy is None:
            self._policy = policy_from_c(p)
            self._policy_version = int(version[0])
        return self._policy

    def set_policy(self, policy: LanePolicy) -> None:
        check(lib.rl_policy_set(self.handle, policy_to_c(policy)), "set_policy")

    def owners(self) -> list[tuple[int, int, int, int]]:
        """(owner id, pid, start time ms, state word) of every slot that is not free.

        The state word names the registration; pass it back to ``rl_owner_mark_dead`` so only
        that registration is marked, never a process that took the slot over since.
        """
        pid, start, state = ffi.new("uint32_t *"), ffi.new("uint64_t *"), ffi.new("uint64_t *")
        found = []
        for o in range(1, lib.RL_MAX_OWNERS):
            check(lib.rl_owner_get(self.handle, o, pid, start, state))
            if owner_state(int(state[0])) != OWNER_FREE:
                found.append((o, int(pid[0]), int(start[0]), int(state[0])))
        return found

    def close(self) -> None:
        """Unmap; a process that registered as an owner first ends its leases."""
        if self._handle is None:
            return
        self.request.s = ffi.NULL
        if self._owner and self._owner_pid == os.getpid():
            lib.rl_owner_release(self._handle, self._owner)
        lib.rl_close(self._handle)
        self._handle = None

    def forget(self) -> None:
        """Drop the handle without touching the segment (a forked child's inherited copy)."""
        self.request.s = ffi.NULL
        self._handle = None

    @staticmethod
    def unlink(name: str) -> None:
        check(lib.rl_unlink(name.encode()), f"unlink {name!r}")
