"""One factor scales every duration of the simulation: simulated seconds / factor = real seconds."""

from __future__ import annotations

import time
from dataclasses import dataclass

DEFAULT_FACTOR = 12.0  # a simulated minute is five real seconds


@dataclass(frozen=True)
class Scale:
    factor: float = DEFAULT_FACTOR
    origin: float = 0.0  # the real epoch time that is simulated time 0 of a trace

    def real(self, sim_seconds: float) -> float:
        """Real seconds for a simulated duration."""
        return sim_seconds / self.factor

    def sim(self, real_seconds: float) -> float:
        """Simulated seconds for a real duration."""
        return real_seconds * self.factor

    def at(self, sim_time: float) -> float:
        """The real epoch time of a simulated moment of the trace."""
        return self.origin + sim_time / self.factor

    def now(self) -> float:
        """Simulated seconds since the trace started."""
        return (time.time() - self.origin) * self.factor

    def since_origin(self, real_epoch: float) -> float:
        """Simulated seconds from the trace's start to a real epoch time."""
        return (real_epoch - self.origin) * self.factor
