"""How the CLI and the demo print a drain's summary and the queue counts."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from pgdrain import store
from pgdrain.drain import DrainResult

# Characters that reorder the text shown after them (the "Trojan Source" controls); category
# Cf, so listed here beside the Cc control characters.
_BIDI_CONTROLS = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def printable(text: object) -> str:
    """`text` safe for a terminal: control characters (ESC sequences, CR, newlines, DEL, C1)
    and bidirectional overrides from job data are shown as escapes (\\x1b, \\u202e)
    instead of acting on the terminal or splitting a line."""
    value = str(text)
    if value.isprintable():  # the common case, in C
        return value
    return "".join(
        ch.encode("unicode_escape").decode("ascii")
        if unicodedata.category(ch) == "Cc" or ch in _BIDI_CONTROLS
        else ch
        for ch in value
    )


def format_result(result: DrainResult) -> str:
    line = (
        f"claimed {result.claimed}, done {result.done}, retried {result.retried}, "
        f"failed {result.failed}, lease lost {result.lease_lost}, reclaimed {result.reclaimed}, "
        f"released {result.released}; stopped: {result.stop_reason} after {result.elapsed_s}s"
    )
    return line + (f" ({printable(result.error)})" if result.error else "")


def format_stats(rows: Sequence[store.QueueStats]) -> str:
    header = f"{'queue':<16}{'queued':>8}{'ready':>8}{'running':>9}{'done':>8}{'failed':>8}"
    header += f"{'oldest ready':>14}{'expired':>9}"
    lines = [header]
    for r in rows:
        lines.append(
            f"{printable(r.queue):<16}{r.queued:>8}{r.ready:>8}{r.running:>9}{r.done:>8}{r.failed:>8}"
            f"{r.oldest_ready_age_s:>13.1f}s{r.expired_leases:>9}"
        )
    if not rows:
        lines.append("(no jobs)")
    return "\n".join(lines)
