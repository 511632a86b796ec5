"""Taking back the jobs whose lease expired (a run that died), at the start of a run: queued
again, or failed (or parked) when their attempts are spent.

The reclaim goes with the run's first claim, in its round trip and before it, so that claim can
take what it queued again (Session.read_with_next); it is reported once that round trip is
back. Safe to send twice (after a lost connection): a lease taken back is no longer expired, so
it matches nothing.

Before it, in the same round trip, goes the raise of the floors the run's scans start from
(docs/decisions/0017): the reclaim's (migration 0024) and each queue's, which the claims and the
exit check read (0026). Behind a snapshot held open elsewhere, they no longer walk the dead
index entries of every job that ran since."""

from __future__ import annotations

import logging

from pgdrain.db import store
from pgdrain.db.session import Later, Session
from pgdrain.runner.summary import Counters

log = logging.getLogger(__name__)


class Reclaim:
    def __init__(self, session: Session, counters: Counters, limit: int) -> None:
        self._session = session
        self._counters = counters
        self._limit = limit
        self._reclaimed: Later[list[store.Reclaimed]] | None = None

    def send_with_next(self) -> None:
        # First, in a transaction of its own: the floors the run's scans start from.
        self._session.send_with_next(store.floors_raise)
        self._reclaimed = self._session.read_with_next(
            store.job_reclaim_expired_statement(self._limit)
        )

    def report(self) -> None:
        """Log and count what it took back, once its round trip is back (else later)."""
        later = self._reclaimed
        if later is None or not later.received:
            return
        self._reclaimed = None
        reclaimed = later.value()
        for job in reclaimed:
            log.warning(
                "reclaimed a job whose lease expired",
                extra={"job_id": job.id, "status": job.status, "reclaims": job.reclaim_count},
            )
        self._counters.add("reclaimed", len(reclaimed))

    def finish(self) -> None:
        """At the run's end: sent alone if no statement carried it, and reported."""
        if self._reclaimed is not None and not self._reclaimed.received:
            self._session.send_pending()
        self.report()
