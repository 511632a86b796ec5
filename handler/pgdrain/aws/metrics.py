"""Progress metrics: the drain's counters become CloudWatch metrics (EMF on stdout through
Powertools) while the run goes on. A Lambda timeout is a hard kill with nothing in `finally`
run, so counts must leave the process every few seconds, not only at the end."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from types import TracebackType

from aws_lambda_powertools import Metrics
from aws_lambda_powertools.metrics import MetricUnit

log = logging.getLogger(__name__)

DEFAULT_NAMESPACE = "pgdrain"
FLUSH_INTERVAL_SECONDS = 3.0

# drain's counters -> CloudWatch metric names (Count). `released` is routine and not reported.
COUNT_METRICS = {
    "claimed": "JobsClaimed",
    "done": "JobsSucceeded",
    "retried": "JobsRetried",
    "failed": "JobsFailed",
    "cancelled": "JobsCancelled",
    "lease_lost": "LeasesLost",
    "reclaimed": "Reclaimed",
}
DEPTH_METRIC = "QueueDepth"
AGE_METRIC = "OldestReadyAgeSeconds"
DELETED_METRIC = "JobsDeleted"  # scheduled runs: finished jobs deleted by retention


def metrics_namespace(env: Mapping[str, str]) -> str:
    return env.get("POWERTOOLS_METRICS_NAMESPACE") or DEFAULT_NAMESPACE


class ProgressMetrics:
    """drain's observer: counts become CloudWatch metrics (EMF on stdout) flushed at most every
    FLUSH_INTERVAL_SECONDS while the run goes on, and once more at the end. Every counter is
    reported in every run, zero included, so a graph shows quiet runs rather than gaps."""

    def __init__(self, metrics: Metrics, interval: float = FLUSH_INTERVAL_SECONDS) -> None:
        self._metrics = metrics
        self._interval = interval
        self._pending: dict[str, tuple[float, MetricUnit]] = {}
        self._reported: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pgdrain-metrics", daemon=True)

    def __enter__(self) -> ProgressMetrics:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def observe(self, counter: str, n: int) -> None:
        name = COUNT_METRICS.get(counter)
        if name is None:
            return
        with self._lock:
            value, _unit = self._pending.get(name, (0.0, MetricUnit.Count))
            self._pending[name] = (value + n, MetricUnit.Count)

    def count(self, name: str, n: int) -> None:
        """A count of the control plane's own (WakeCreated, WakeFailed, RunsSpawned, ...)."""
        with self._lock:
            value, _unit = self._pending.get(name, (0.0, MetricUnit.Count))
            self._pending[name] = (value + n, MetricUnit.Count)

    def gauge(self, name: str, value: float, unit: MetricUnit) -> None:
        with self._lock:
            self._pending[name] = (value, unit)

    def flush(self) -> None:
        with self._lock:
            if not self._pending:
                return
            for name, (value, unit) in self._pending.items():
                self._metrics.add_metric(name=name, unit=unit, value=value)
            self._reported.update(self._pending)
            self._pending.clear()
            self._metrics.flush_metrics()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._lock:
            for name in COUNT_METRICS.values():
                if name not in self._reported and name not in self._pending:
                    self._pending[name] = (0.0, MetricUnit.Count)
        self.flush()

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception as exc:  # metrics must never stop the run; the end flush retries
                log.warning("could not flush metrics: %s", exc)
