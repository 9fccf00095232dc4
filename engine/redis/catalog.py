"""The record of a Redis queue spread over shards: how many, and where each one's keys are.

A queue of one shard is five keys with the hash tag ``{name}`` (``codec.queue_keys``) and has
no record. A queue over N > 1 shards (``engine.redis.shards.ShardedEngine``) keeps shard 0 under
the same tag, beside one more key, ``lanes:{name}:shards`` (a JSON string, :class:`Catalog`):
the shard count, the layout of the spreading, and the hash tag of each shard. The tags are
recorded, not derived, because on a Cluster they are picked at creation to fall on different
primaries (``shards.place``), and the cluster's shape at that moment is not knowable later.

A shard past 0 has the keys ``lanes:{<tag>}:shard:ready`` ...: the ``:shard:`` part makes them
keys no queue name can produce (a name holds no brace), so a queue named like a shard's tag
never shares its keys.

Both doors check the record: ``RedisEngine.connect`` refuses a queue that has one
(:class:`ShardsMismatch`, naming the count), and the sharded engine refuses a count that
differs from it, or a single queue, saying how to move (save, then load into a new queue).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ..errors import LayoutMismatch
from .codec import queue_keys

SHARD_LAYOUT = 1
"""How a queue is spread over shards (the record's fields, the shard keys, row ids and tokens
``row = local * N + shard``): bump with any change to them; a record of another layout is
refused."""
MAX_SHARDS = 256
"""The most shards one queue spreads over (a cluster of 256 primaries is already rare)."""

HOW_TO_MOVE = ("save it (eng.save(path), or a pool's --checkpoint) and load the file"
               " into a new queue with the count wanted (ShardedEngine.load(path, url, name,"
               " shards=N), or lanes pool NEW --resume --checkpoint FILE --redis URL --shards N)")


class ShardsMismatch(LayoutMismatch):
    """A queue's shard count is not the one asked for (``shards`` says what it is)."""

    def __init__(self, message: str, shards: int) -> None:
        super().__init__(message)
        self.shards = shards
        """The queue's own shard count (1: a queue of today's single layout)."""


def catalog_key(name: str) -> str:
    """The key of queue ``name``'s record, under shard 0's hash tag."""
    return queue_keys(name)[0].removesuffix("ready") + "shards"


def shard_keys(name: str, tag: str) -> tuple[str, str, str, str, str]:
    """The five keys of the shard with hash tag ``tag`` of queue ``name`` (shard 0: the tag is
    the name, and the keys are those of a single queue)."""
    if tag == name:
        return queue_keys(name)
    prefix = f"lanes:{{{tag}}}:shard:"
    return tuple(prefix + k.rsplit(":", 1)[1] for k in queue_keys(name))  # type: ignore[return-value]


@dataclass(frozen=True)
class Catalog:
    """The record: ``tags[i]`` is shard i's hash tag (``tags[0]`` the queue's name)."""

    layout: int
    tags: tuple[str, ...]

    @property
    def shards(self) -> int:
        return len(self.tags)

    def to_json(self) -> str:
        return json.dumps({"layout": self.layout, "shards": self.shards, "tags": self.tags})

    @classmethod
    def from_json(cls, name: str, text: bytes | str) -> Catalog:
        """The record as stored; ``LayoutMismatch`` (with how to move) if it is not one this
        client reads."""
        try:
            got = json.loads(text)
            layout, tags = int(got["layout"]), tuple(str(t) for t in got["tags"])
            if int(got["shards"]) != len(tags) or not 1 < len(tags) <= MAX_SHARDS:
                raise ValueError(f"{got['shards']} shards, {len(tags)} tags")
        except (ValueError, KeyError, TypeError) as e:
            raise LayoutMismatch(f"queue {name!r}: its shard record {catalog_key(name)} is not"
                                 f" readable ({e})") from None
        if layout != SHARD_LAYOUT:
            raise LayoutMismatch(f"queue {name!r} is spread over shards by layout {layout}; this"
                                 f" client reads layout {SHARD_LAYOUT}: to move it, {HOW_TO_MOVE}")
        if tags[0] != name:
            raise LayoutMismatch(f"queue {name!r}: its shard record names shard 0 {tags[0]!r}")
        return cls(layout, tags)


def refuse_count(name: str, has: int, asked: int) -> ShardsMismatch:
    """The refusal of a connection asking ``asked`` shards of a queue that has ``has``."""
    what = "one queue (not sharded)" if has == 1 else f"spread over {has} shards"
    return ShardsMismatch(f"queue {name!r} is {what}, not {asked}: connect with shards={has} (or"
                          f" leave shards out); a queue's count never changes in place, so to"
                          f" move it, {HOW_TO_MOVE}", has)
