"""The run's deadline: when to stop claiming (the reserve), when to stop waiting for running
jobs (the final margin), and how far a lease may reach (never past the deadline)."""

from __future__ import annotations

from pgdrain.budget import FINAL_MARGIN_SECONDS, Budget
from pgdrain.controls import ALL_ON, Controls


class Deadline:
    def __init__(
        self, budget: Budget, reserve_seconds: float, *, controls: Controls = ALL_ON
    ) -> None:
        self.budget = budget
        self.reserve_seconds = reserve_seconds
        self._cap_leases = controls.cap_lease_at_deadline

    def remaining(self) -> float:
        return self.budget.remaining()

    def below_reserve(self) -> bool:
        """Too little time left to start more work."""
        return self.budget.exhausted(self.reserve_seconds)

    def at_final_margin(self) -> bool:
        return self.budget.remaining() <= FINAL_MARGIN_SECONDS

    def lease_cap(self) -> float | None:
        """The longest a lease may run: to the deadline, never past it (None: uncapped, the
        control that shows what the cap prevents)."""
        return self.budget.remaining() if self._cap_leases else None

    def seconds_until_check(self, stopping: bool) -> float:
        """How long the loop may wait before it must look again: at the reserve while it
        claims, at the final margin once it stops. A job that outlasts the budget must not
        hold the run past its deadline."""
        margin = FINAL_MARGIN_SECONDS if stopping else self.reserve_seconds
        return self.budget.remaining() - margin
