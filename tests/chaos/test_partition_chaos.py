"""Chaos across hosts cut off from Redis: three ``lanes pool --redis`` pools, each in a network
namespace of its own (a host), share one queue; at random moments a host's link goes down for
1-3 leases and comes back, one or two hosts at a time, while every pool renders; then the links
heal, the queue drains and the partition oracle runs (tests/lib/partition_lib.py): nothing
lost, every row rendered and completed once, the late completes of cut-off hosts refused.

A seed of its own each run, printed and in every failure message; ``RL_PARTITION_CHAOS_SEED``
repeats the runner's choices (not the timing), ``RL_PARTITION_CHAOS_SECONDS`` sets the length
(default 6 s). The long form is ``bench/chaos_partition.py``.
"""

from __future__ import annotations

import os

import pytest
from netns import unavailable
from partition_lib import Partitioned, partition_chaos

SECONDS = float(os.environ.get("RL_PARTITION_CHAOS_SECONDS", "6"))


@pytest.mark.skipif(unavailable() is not None, reason=str(unavailable()))
def test_pools_on_hosts_cut_off_at_random_lose_no_row_and_complete_none_twice() -> None:
    seed = int(os.environ.get("RL_PARTITION_CHAOS_SEED") or int.from_bytes(os.urandom(4),
                                                                            "little"))
    with Partitioned(hosts=3, rows=300, lease_s=1.5, heartbeat_s=0.5, render_s=0.15) as run:
        res = partition_chaos(run, SECONDS, seed)
    print()
    print(res.summary())
    why = f"RL_PARTITION_CHAOS_SEED={seed} repeats it: {res.summary()}"
    assert res.problems == [], why
    assert res.cuts >= 2 and res.rendered_twice >= 1, why  # cuts that cost leases
    assert sum(res.lost) >= 1, why  # some cut-off host's late call was refused, and counted
