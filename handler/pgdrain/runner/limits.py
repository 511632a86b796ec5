"""Per-queue limits (PGDRAIN_QUEUE_LIMITS) from a run's side: the count's self-correction.

A limit's running count is kept exact by the count trigger and by the way its row is created
(migration 0012). Should it drift high anyway (a running job deleted by hand, the trigger off
during a restore), the queue would claim nothing while its jobs wait, for good. So a run asks,
with its first claim and (pgdrain.aws.control) with its exit check, in their round trips, for an
exact recount of each of its queues that is full while a job of it is ready
(store.queue_limit_recount: one probe of pgdrain.queue_limits when none is). A correction is
logged as a WARNING. Safe to send twice: a count made exact stays exact."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db import store
from pgdrain.db.session import Later, Session
from pgdrain.settings import Settings

log = logging.getLogger(__name__)


class LimitRecount:
    def __init__(
        self,
        session: Session,
        queues: Sequence[str] | None,  # None: every queue
        *,
        controls: Controls = ALL_ON,
    ) -> None:
        self._session = session
        self._queues = None if queues is None else tuple(queues)
        self._on = controls.recount_full_limits
        self._recounted: Later[list[store.Recounted]] | None = None

    def send_with_next(self) -> None:
        """Ride in the round trip of the session's next statement, in a transaction of its own
        before it (so a claim or an exit check that follows sees the slots it freed)."""
        if self._on:
            self._recounted = self._session.read_with_next(
                store.queue_limit_recount_statement(self._queues)
            )

    def report(self) -> list[store.Recounted]:
        """What it corrected, logged once its round trip is back (else nothing yet)."""
        later = self._recounted
        if later is None or not later.received:
            return []
        self._recounted = None
        corrected = later.value()
        for row in corrected:
            log.warning(
                "a queue limit's running count had drifted, or a job cancelled while it ran "
                "has reached its lease's end: recounted",
                extra={"queue": row.queue, "counted": row.was, "running": row.running},
            )
        return corrected

    def finish(self) -> list[store.Recounted]:
        """At the run's end: sent alone if no statement carried it, and reported."""
        if self._recounted is not None and not self._recounted.received:
            self._session.send_pending()
        return self.report()


def send_configured_limits(
    session: Session,
    settings: Settings,
    queues: Sequence[str] | None,  # None: every queue
) -> None:
    """For a run outside the function's control plane (`pgdrain drain`, `pgdrain worker`, the
    Python API): write, with its first claim, the limits PGDRAIN_QUEUE_LIMITS configures for
    the queues it drains, as each of the function's runs does (pgdrain.aws.control). A limit
    binds a run only once a row holds it. Only the rows of the queues it limits are written, so
    a process that configures none leaves the function's as they are. Safe to send twice: the
    rows are set to the same values, and a paused queue stays paused."""
    served = None if queues is None else set(queues)
    limits = [(q, n) for q, n in settings.queue_limits if served is None or q in served]
    rates = [r for r in settings.queue_rates if served is None or r[0] in served]
    limited = sorted({q for q, _ in limits} | {r[0] for r in rates})
    if limited:
        session.send_with_next(store.queue_limit_sync, limited, limits, rates)
