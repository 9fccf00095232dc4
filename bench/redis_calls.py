"""What one worker cycle costs the server: the redis.calls a `complete_and_claim` of 16 makes
(INFO commandstats, everything but the FCALL itself, divided by the cycles) and the server's
time per FCALL (commandstats and SLOWLOG median). docs/redis.md "Figures" quotes it.

    PYTHONPATH=. .venv/bin/python bench/redis_calls.py [--rows N] [--cycles N]

Run it with PYTHONPATH at another checkout to measure that version on the same machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests" / "lib"))

from common import BUDGET, NOW, corpus  # noqa: E402
from redis_server import RedisServer  # noqa: E402

from engine import RedisEngine  # noqa: E402

LEASE_MS = 60_000


def measure(rows: int, cycles: int) -> dict[str, object]:
    with RedisServer() as srv:
        r = srv.client()
        with RedisEngine.connect(srv.url, "calls", create=True) as eng:
            eng.add_many(*corpus(rows))
            held = eng.claim(budget=BUDGET, now_ms=NOW, lease_ms=LEASE_MS)
            for _ in range(50):  # warm up
                _, held = eng.complete_and_claim(held.rows, held.tokens, budget=BUDGET,
                                                 now_ms=NOW, lease_ms=LEASE_MS)
            r.config_set("slowlog-log-slower-than", 0)  # type: ignore[attr-defined]
            r.config_set("slowlog-max-len", cycles + 100)  # type: ignore[attr-defined]
            r.slowlog_reset()  # type: ignore[attr-defined]
            r.config_resetstat()  # type: ignore[attr-defined]
            granted = 0
            for _ in range(cycles):
                ok, held = eng.complete_and_claim(held.rows, held.tokens, budget=BUDGET,
                                                  now_ms=NOW, lease_ms=LEASE_MS)
                granted += len(held)
            stats = r.info("commandstats")  # type: ignore[attr-defined]
            slow = [e["duration"] for e in r.slowlog_get(cycles + 100)  # type: ignore
                    if e["command"].startswith(b"FCALL lanes_complete_claim")]
    per = {k.removeprefix("cmdstat_"): v["calls"] / cycles for k, v in stats.items()
           if k not in ("cmdstat_fcall", "cmdstat_config", "cmdstat_slowlog")}
    fcall = stats["cmdstat_fcall"]
    return {"calls_per_cycle": round(sum(per.values()), 1),
            "by_command": {k: round(v, 2) for k, v in sorted(per.items(), key=lambda kv: -kv[1])},
            "usec_in_calls": round(sum(v["usec"] for k, v in stats.items()
                                       if k.removeprefix("cmdstat_") in per) / cycles, 1),
            "fcall_usec_commandstats": round(fcall["usec_per_call"], 1),
            "fcall_usec_slowlog_p50": statistics.median(slow) if slow else None,
            "fcall_usec_slowlog_range": (min(slow), max(slow)) if slow else None,
            "rows_per_cycle": granted / cycles}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cycles", type=int, default=2000)
    a = ap.parse_args()
    for k, v in measure(a.rows, a.cycles).items():
        print(f"{k}: {v}")


if __name__ == "__main__":
    main()
