"""Chaos on Redis's primary: killed again and again under running pools, behind Sentinel.

Two ``lanes pool --redis redis+sentinel://... --wait-replicas 1`` pools and a probe client run
while the primary is SIGKILLed at a random moment of a ``lanes add``, its replica promoted, the
killed server brought back as the new replica, then the new primary killed in turn (the roles go
back and forth) (tests/lib/failover_lib.py). Afterwards: no row lost, ``verify()`` empty, a drain
returns every row once, every URL ``lanes add`` reported added is there (an add the kill cut off
reports an unknown outcome, and then is there whole or not at all), and no write the server
acknowledged is lost.

Why ``lanes add`` under WAIT: without it an add the server acknowledged can be lost in a
failover (docs/redis.md, "Failover"); with it an add is acknowledged only once a replica has it.

``RL_FAILOVER_CHAOS_SEED`` repeats the runner's choices (the moments of the kills);
``RL_FAILOVER_CHAOS_KILLS`` sets how many kills (default 2). The long form, with and without
WAIT and on a cluster too, is ``bench/bench_failover.py``.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
import uuid
from pathlib import Path

from failover_lib import LIB, ROOT, FailoverConfig, FailoverRun, SentinelTarget
from pool_testlib import running

from engine import Engine
from engine.redis.transport import with_wait
from engine.redis.urls import RedisUrls

KILLS = int(os.environ.get("RL_FAILOVER_CHAOS_KILLS", "2"))


def test_pools_lose_no_row_and_no_acknowledged_write_over_repeated_failovers(
        tmp_path: Path) -> None:
    seed = int(os.environ.get("RL_FAILOVER_CHAOS_SEED") or int.from_bytes(os.urandom(4), "little"))
    rng = random.Random(seed)
    target = SentinelTarget().start()
    queue = f"rl-foc-{uuid.uuid4().hex[:10]}"
    outputs: list[str] = []

    def kill_while_adding() -> None:
        """``lanes add`` from a process of its own, and the kill at a random moment of it: an
        add the kill cut off fails with an unknown outcome (its URLs are not expected), any
        other is acknowledged under WAIT (and must be kept)."""
        extra = [f"https://grown{len(outputs)}.example/p/{k}" for k in range(40)]
        path = tmp_path / f"add-{len(outputs)}.csv"
        path.write_text("url,interval_s\n" + "".join(f"{u},3600\n" for u in extra))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((LIB, ROOT))}
        adding = subprocess.Popen(
            [sys.executable, "-m", "engine", "add", queue, "--redis", with_wait(target.url, 1),
             "--corpus", str(path)], env=env, text=True, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT)
        time.sleep(rng.uniform(0.0, 1.2))  # its start-up takes about a second
        killed = target.fail_over(queue)
        target.rejoin(killed)
        out, _ = adding.communicate(timeout=60)
        outputs.append(out)
        if adding.returncode == 0:
            assert "40 new URL(s) added" in out, out
            run.added.extend(extra)
            return
        assert "may or may not have been applied" in out or "acknowledged it" in out, out
        with Engine.connect(target.url, queue) as eng:  # one FCALL: all of it or none
            kept = set(extra) & set(RedisUrls(eng).urls())
        assert kept in (set(), set(extra)), out
        run.added.extend(extra if kept else [])

    try:
        cfg = FailoverConfig(kills=KILLS, wait_replicas=1, rows=2000,
                             before_s=rng.uniform(0.3, 1.0), after_s=rng.uniform(1.6, 2.4))
        run = FailoverRun(cfg, target, queue, str(tmp_path))
        res = run.run(disrupt=kill_while_adding)
    finally:
        target.stop()
    why = f"seed {seed} (RL_FAILOVER_CHAOS_SEED={seed} repeats it): {res.summary()} {outputs}"
    print("\nfailover chaos:", why)
    assert running({p.pid for p in target.group.sentinel_procs}) == set()
    assert res.kills == KILLS and len(outputs) == KILLS, why
    # every row there, the corpus's and the added ones (acknowledged under WAIT), each URL
    # mapped both ways; verify() empty; a drain returns each row once
    assert res.problems() == [], why
    assert res.acked_adds_lost == 0 and res.acked_completes_lost == 0, why
    assert max(res.stalls) < 15, why
