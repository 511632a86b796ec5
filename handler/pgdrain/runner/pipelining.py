"""Pipelined claims: the claims a run sent before reading the last reply, oldest first
(db/pipeline.py): sending one, reading the oldest as a round trip's reply, reading them all
before any other statement, and taking them up one by one after the connection broke under
them.

A claim read as soon as it is sent (`claim_now`: nothing else to pipeline, as at concurrency
1) goes through the same pipeline whenever one could be pipelined: the same one round trip as
psycopg's cursor, for less of the client's CPU (docs/decisions/0006)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

import psycopg

from pgdrain.controls import ALL_ON, Controls
from pgdrain.db.session import Session
from pgdrain.runner.claim_statement import Claim, ClaimStatements

if TYPE_CHECKING:
    from pgdrain.runner.claiming import Claims


class PipelinedClaims:
    def __init__(
        self,
        claims: Claims,
        statements: ClaimStatements,
        session: Session,
        *,
        controls: Controls = ALL_ON,
    ) -> None:
        self._claims = claims
        self._statements = statements
        self._session = session
        self._enabled = controls.pipelining
        self._count_slots = controls.count_claims_on_the_wire
        self._on_wire: deque[Claim] = deque()
        self.last_full = False  # the last claim read took all it asked for
        session.settle_with(self.settle)

    def may_send(self) -> bool:
        return self._enabled and self._session.may_send_ahead()

    def count(self) -> int:
        """How many claims are on the wire."""
        return len(self._on_wire)

    def slots(self) -> int:
        """How many jobs the claims on the wire may bring: the slots they take."""
        if not self._count_slots:
            return 0  # control: claims sized as if none were on the wire
        return sum(claim.limit for claim in self._on_wire)

    def oldest_limit(self) -> int:
        """The limit of the claim `read` reads next."""
        return self._on_wire[0].limit

    def send(self, limit: int) -> None:
        """Send a claim (with the jobs finished since the last) whose reply `read` reads later:
        the database runs it while this thread reads the claim before it and starts its jobs.
        Nothing is sent if may_send() no longer holds (the limits went stale since the
        caller asked): the next claim then goes in a round trip of its own."""
        if self.may_send():
            self._send(limit)

    def claim_now(self, limit: int, while_sent: Callable[[], None] | None = None) -> int | None:
        """A claim in a round trip of its own, through the pipeline: sent, `while_sent` run,
        its reply read. Returns how many it claimed, or None, having sent nothing, when no claim
        may go this way (may_send() does not hold, or claims are on the wire): the caller then
        claims through psycopg's cursor."""
        if self._on_wire or not self.may_send():
            return None
        taken_up = self._send(limit)
        if taken_up is not None:
            return taken_up[0]
        return self.read(while_sent)

    def _send(self, limit: int) -> list[int] | None:
        """Send a claim. If the connection broke under it, every claim on the wire is taken up
        (_take_up) and what each claimed is returned; else None."""
        claim = self._statements.new(limit)
        self._on_wire.append(claim)
        try:
            self._session.send_ahead(self._statements.statement(claim))
        except psycopg.Error as exc:
            if not self._session.broken():
                self._on_wire.remove(claim)  # not sent: nothing to read for it
                raise
            return self._take_up(exc)
        return None

    def read(self, while_sent: Callable[[], None] | None = None) -> int:
        """Read the oldest claim on the wire, recorded as a round trip's reply; returns how many
        it claimed. `while_sent` runs first: the claim is out, so that is while the database
        runs it. A claim that failed fails the run as one made in its own round trip would,
        once the claims behind it are read (the jobs they took kept, their completions
        recorded)."""
        if while_sent is not None:
            try:
                while_sent()
            except BaseException:
                self.settle()  # the claims on the wire are read (their jobs kept) first
                raise
        claim = self._on_wire[0]
        try:
            rows = self._session.read_ahead()
        except psycopg.errors.DeadlockDetected as exc:
            self._on_wire.popleft()
            if not self._session.resend_deadlocked(exc, 1):
                self.settle()
                raise
            # It rolled back whole: made again, in a round trip of its own once the claims
            # behind it are read (run_recovering settles them first).
            made = self._session.run_recovering(
                self._statements.operation(claim), self._statements.recover(claim)
            )
            return self._claims.received(claim, *made)
        except psycopg.Error as exc:
            if self._session.broken():
                return self._take_up(exc)[0]
            self._on_wire.popleft()
            self.settle()
            raise
        self._on_wire.popleft()
        return self._claims.received(claim, *self._statements.read(claim, rows))

    def settle(self) -> None:
        """Read every claim on the wire (the session calls it before any other statement)."""
        while self._on_wire:
            self.read()

    def _take_up(self, exc: BaseException) -> list[int]:
        """The connection broke with claims on the wire: reconnect and, for each in the order
        they were sent, ask what it did (ClaimStatements.recover, as after a claim's lost
        reply) and record that as its reply. Returns what each claimed."""
        on_wire = list(self._on_wire)
        self._on_wire.clear()
        self._session.reconnect(exc)
        counts = []
        for claim in on_wire:
            recover = self._statements.recover(claim)
            made = self._session.run_recovering(recover, recover)
            counts.append(self._claims.received(claim, *made))
        return counts
