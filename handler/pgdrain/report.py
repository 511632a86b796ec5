"""How the CLI and the demo print a drain's summary and the queue counts."""

from __future__ import annotations

from collections.abc import Sequence

from pgdrain import store
from pgdrain.drain import DrainResult


def format_result(result: DrainResult) -> str:
    line = (
        f"claimed {result.claimed}, done {result.done}, retried {result.retried}, "
        f"failed {result.failed}, lease lost {result.lease_lost}, reclaimed {result.reclaimed}, "
        f"released {result.released}; stopped: {result.stop_reason} after {result.elapsed_s}s"
    )
    return line + (f" ({result.error})" if result.error else "")


def format_stats(rows: Sequence[store.QueueStats]) -> str:
    header = f"{'queue':<16}{'queued':>8}{'ready':>8}{'running':>9}{'done':>8}{'failed':>8}"
    header += f"{'oldest ready':>14}{'expired':>9}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{r.queue:<16}{r.queued:>8}{r.ready:>8}{r.running:>9}{r.done:>8}{r.failed:>8}"
            f"{r.oldest_ready_age_s:>13.1f}s{r.expired_leases:>9}"
        )
    if not rows:
        lines.append("(no jobs)")
    return "\n".join(lines)
