"""A corpus that follows the site: ``lanes pool --refresh-corpus 1h`` reads the pool's
``--corpus`` again (files re-read, sitemap URLs fetched again) every period while it runs.

What a refresh does to the running pool (:func:`follow`):

* URLs the pool does not have yet are added, as ``lanes add`` adds them (``grow.add_corpus``);
  only the new ones are passed, so a refresh never unparks a row (re-adding a parked URL is
  how an operator says "try again", and a timer is not an operator);
* provenance is derived, not stored intent: a known URL gets the provenance the corpus gives it
  now (``submitted`` for a sitemap's), and a URL that left every source becomes ``discovered``
  (``reclassify``, which keeps its due time, failures and any lease). A URL that comes back is
  ``submitted`` again. URLs added by ``lanes add`` from other files count as not in the corpus.

A refresh runs in a thread of the supervisor's process with handles of its own on the engine
and the URLs (``attach``), so neither a slow site nor matching a large corpus to the pool's
rows holds up the supervisor's tick (restarting dead workers, checkpoints); the tick only
starts it and reports how it went. A read that fails (the site down, a malformed sitemap:
``CorpusError``) is logged with its reason and changes nothing; the next period tries again.
So does a read that finds no URL at all (a site answering an empty sitemap is likelier broken
than emptied). Periods are counted from the end of the previous refresh.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import numpy as np

from .. import checkpoint
from ..corpus.model import Corpus
from ..corpus.variant_rows import SEPARATOR, url_of
from ..errors import CapacityError, EngineValueError
from ..policy import PROVENANCES, LanePolicy
from ..report.words import format_duration
from .grow import add_corpus

log = logging.getLogger("engine.pool")

_DURATION: Final = re.compile(r"([0-9]{1,9})([smhd])")
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
_DISCOVERED: Final = PROVENANCES.index("discovered")


def parse_duration(text: str) -> int:
    """``"2s"``, ``"15m"``, ``"1h"``, ``"1d"`` -> seconds (at least 1)."""
    m = _DURATION.fullmatch(text.strip()) if isinstance(text, str) else None
    if m is None or int(m.group(1)) == 0:
        raise EngineValueError(f"a period is a whole number and a unit, like 30s, 15m, 1h or"
                               f" 1d, got {text!r}")
    return int(m.group(1)) * _UNITS[m.group(2)]


@dataclass(frozen=True)
class Refreshed:
    """What one refresh changed."""

    rows: int  # URLs in the corpus read
    added: int  # new URLs, now rows
    discovered: int  # known URLs that left the corpus (or that it now says are discovered)
    submitted: int  # known URLs back in the corpus as submitted

    def __str__(self) -> str:
        return (f"{self.rows} URLs read; {self.added} new URL(s) added, {self.discovered} now"
                f" discovered (left every sitemap), {self.submitted} submitted again")


def follow(eng: Any, urls: Any, corpus: Corpus) -> Refreshed:
    """Make the pool over ``eng`` (URL table ``urls``, either backend) follow ``corpus``: add its
    new URLs, then reclassify every known row whose provenance differs from what ``corpus``
    says (not in it: discovered). Raises ``EngineError`` (nothing added) if the adding fails."""
    urls.refresh()
    known = urls.urls()
    row_of = {u: r for r, u in enumerate(known)}
    at = np.fromiter((row_of.get(u, -1) for u in corpus.urls), np.int64, len(corpus))
    fresh = at < 0
    added = add_corpus(eng, urls, corpus.select(fresh)).added if fresh.any() else 0
    want = np.full(len(known), _DISCOVERED, np.int64)
    want[at[~fresh]] = corpus.provenance[~fresh]
    # a further variant's row (``URL mobile``: corpus/variant_rows.py) follows its URL's
    variants = [(r, row_of.get(url_of(k), -1)) for r, k in enumerate(known) if SEPARATOR in k]
    for r, plain in variants:
        if plain >= 0:
            want[r] = want[plain]
    rows, cols = checkpoint.snapshot(eng)
    mine = rows < len(known)  # rows added meanwhile (another adder, another host) wait
    rows, prov_now = rows[mine], cols["provenance"][mine]
    moved = [0, 0]
    for row in rows[prov_now != want[rows]].tolist():
        try:
            eng.reclassify(row, int(want[row]))
        except EngineValueError:
            continue  # removed meanwhile: nothing to classify
        moved[int(want[row])] += 1
    return Refreshed(len(corpus), added, moved[_DISCOVERED], moved[1 - _DISCOVERED])


def refit(eng: Any) -> bool:
    """Fit the lane weights of ``eng``'s policy to the intervals of the rows it now holds
    (``LanePolicy.fitted`` over the same bands, urgent cap and floors: no row changes lane);
    whether the policy changed. ``lanes pool --fit-policy`` does it after every refresh."""
    rows, cols = checkpoint.snapshot(eng)
    if not len(rows):
        return False
    now = eng.policy
    fitted = LanePolicy.fitted(cols["interval_s"], cols["provenance"], ttl_bands=now.ttl_bands,
                               cold_after=now.cold_after, min_share=now.min_share,
                               urgent_max_share=now.urgent_max_share)
    if fitted == now:
        return False
    eng.set_policy(fitted)
    return True


@dataclass(frozen=True)
class _PartWay:
    """A refresh that failed once it had begun to change the pool (a lost connection, say);
    adding comes first and fails whole where it can (capacity), reclassifying is idempotent."""

    error: Exception


class CorpusRefresh:
    """Every ``every_s`` seconds, in a thread: ``read()`` the corpus, ``attach()`` the pool
    (its engine and URL table: handles of the thread's own, closed after) and :func:`follow`.
    The supervisor calls ``tick`` each tick."""

    def __init__(self, read: Callable[[], Corpus], every_s: float,
                 attach: Callable[[], tuple[Any, Any]],
                 clock: Callable[[], float] = time.monotonic, fit: bool = False) -> None:
        if not every_s > 0:
            raise EngineValueError(f"the refresh period must be positive, got {every_s!r}")
        self.read, self.every_s, self.attach, self._clock = read, every_s, attach, clock
        self.fit = fit  # refit the policy's weights after each refresh (--fit-policy)
        self._next = clock() + every_s
        self._thread: threading.Thread | None = None
        self._got: Refreshed | _PartWay | Exception | None = None
        self._applying = threading.Lock()
        self._closed = False
        self.done = 0  # refreshes applied
        self.failed = 0  # refreshes that changed nothing (a read or an add failed)
        self.last: Refreshed | None = None

    def tick(self) -> Refreshed | None:
        """Start a refresh when one is due; report a finished one (returned, or None)."""
        if self._thread is None:
            if self._clock() >= self._next and not self._closed:
                self._thread = threading.Thread(target=self._refresh, name="corpus-refresh",
                                                daemon=True)
                self._thread.start()
            return None
        if self._thread.is_alive():
            return None
        self._thread.join()
        self._thread = None
        got, self._got = self._got, None
        self._next = self._clock() + self.every_s
        return self._report(got)

    def _report(self, got: Refreshed | _PartWay | Exception | None) -> Refreshed | None:
        """Count and log how a refresh went."""
        then = f"next in {format_duration(self.every_s)}"
        if got is None:
            return None  # closed before it changed anything
        if isinstance(got, _PartWay):
            self.failed += 1
            log.warning("corpus refresh stopped part way (the next, in %s, completes it): %s",
                        format_duration(self.every_s), got.error)
            return None
        if not isinstance(got, Refreshed):
            self.failed += 1
            log.warning("corpus refresh failed, nothing changed (%s): %s", then, got)
            return None
        self.done += 1
        self.last = got
        log.info("corpus refresh: %s (%s)", got, then)
        return got

    def _refresh(self) -> None:
        try:
            corpus = self.read()
            if not len(corpus):
                # A site that answers an empty sitemap is far likelier broken than emptied:
                # taken at its word, it would make every page discovered at once.
                raise EngineValueError("the corpus read holds no URL; a pool is never emptied"
                                       " by a refresh")
        except Exception as e:  # reported by tick, never raised in the supervisor
            self._got = e
            return
        with self._applying:
            if self._closed:
                return  # the pool is going: its files must not gain a URL file now
            try:
                eng, urls = self.attach()
            except Exception as e:
                self._got = e
                return
            try:
                self._got = follow(eng, urls, corpus)
                if self.fit and refit(eng):
                    log.info("corpus refresh: lane weights fitted again: %s",
                             dict(eng.policy.weights))
            except CapacityError as e:  # refused before anything was added
                self._got = e
            except Exception as e:
                self._got = _PartWay(e)
            finally:
                urls.close()
                eng.close()

    def close(self) -> None:
        """No refresh changes the pool from now on: one changing it is waited for (and
        reported), one still reading is left to end by its own timeouts (a daemon thread) and
        then does nothing."""
        with self._applying:
            self._closed = True
            got, self._got = self._got, None
        self._report(got)
