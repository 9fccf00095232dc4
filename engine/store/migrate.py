"""``lanes store migrate DIR s3://...``: every snapshot of one store put into another.

Why through the contract: a put into the target is the same put a render makes (its body made
durable before its pointer), so a migration killed half-way leaves the target whole for what
it copied, and running it again copies the rest (what is there already is "unchanged"). Each
snapshot keeps its rendered-at time, status and interval, so its Age and its staleness do not
restart; the hit log is not moved (it is the last hour's, and the new store starts its own).
"""

from __future__ import annotations

from collections.abc import Callable

from .api import Store


def migrate(source: Store, target: Store,
            progress: Callable[[int, int], None] | None = None) -> dict[str, int]:
    """Copy every snapshot of ``source`` into ``target``: how many were ``written``,
    ``unchanged`` (already there) and ``gone`` (cleared while the copy ran)."""
    urls = sorted(url for url, *_ in source.ages())
    done = {"written": 0, "unchanged": 0, "gone": 0}
    for i, url in enumerate(urls):
        snap = source.get(url)
        if snap is None:
            done["gone"] += 1
            continue
        outcome = target.put(url, snap.html(), status=snap.status, location=snap.location,
                             interval_s=snap.interval_s, lane=snap.lane,
                             render_ms=snap.render_ms, rendered_at_ms=snap.rendered_at_ms)
        done[outcome] += 1
        if progress is not None and (i + 1) % 1000 == 0:
            progress(i + 1, len(urls))
    return done
