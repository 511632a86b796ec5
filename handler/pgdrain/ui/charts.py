"""Charts as SVG drawn on the server: done and failed jobs per minute, stacked bars. No script:
each bar's <title> is its tooltip."""

from __future__ import annotations

import datetime as dt
import math
from dataclasses import dataclass

from pgdrain.db.store import Throughput
from pgdrain.ui.html import text

WIDTH, HEIGHT = 640, 150
LEFT, BOTTOM, TOP = 44, 20, 8  # room for the axis labels


@dataclass(frozen=True)
class Bucket:
    start: dt.datetime
    done: int
    failed: int
    counted: bool  # False: before the count's bound, so not (or not wholly) counted


def buckets(
    throughput: Throughput,
    start: dt.datetime,
    end: dt.datetime,
    step: dt.timedelta,
    queue: str | None = None,
) -> list[Bucket]:
    """The counts summed into buckets of `step` from `start` (a minute boundary) to `end`."""
    n = max(1, math.ceil((end - start) / step))
    done = [0] * n
    failed = [0] * n
    for m in throughput.minutes:
        if queue is not None and m.queue != queue:
            continue
        i = int((m.minute - start) / step)
        if 0 <= i < n:
            done[i] += m.done
            failed[i] += m.failed
    return [
        Bucket(
            start + i * step, done[i], failed[i], start + (i + 1) * step > throughput.counted_from
        )
        for i in range(n)
    ]


def _nice_ceiling(value: float) -> float:
    """1, 2 or 5 times a power of ten, at least `value` (and at least 1)."""
    if value <= 1:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for factor in (1, 2, 5, 10):
        if factor * power >= value:
            return float(factor * power)
    return float(10 * power)


def _label(moment: dt.datetime, step: dt.timedelta) -> str:
    return moment.strftime("%H:%M" if step < dt.timedelta(hours=1) else "%d %H:%M")


def bar_chart(title: str, rows: list[Bucket], step: dt.timedelta) -> str:
    """Stacked bars of done (green) and failed (red) per minute: each bucket's counts divided
    by its minutes. Buckets the count did not reach are grey, and the chart says why."""
    minutes = step / dt.timedelta(minutes=1)
    rates = [((b.done + b.failed) / minutes) for b in rows]
    top = _nice_ceiling(max(rates, default=0.0))
    plot_w, plot_h = WIDTH - LEFT - 4, HEIGHT - BOTTOM - TOP
    bar_w = plot_w / max(1, len(rows))
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{text(title)}">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 4}" y2="{TOP + plot_h}" '
        'stroke="#9ca3af"/>',
        f'<text x="{LEFT - 4}" y="{TOP + 9}" text-anchor="end">{top:g}</text>',
        f'<text x="{LEFT - 4}" y="{TOP + plot_h}" text-anchor="end">0</text>',
    ]
    for i, b in enumerate(rows):
        x = LEFT + i * bar_w
        label = (
            f"{_label(b.start, step)}: {b.done} done, {b.failed} failed"
            f" ({(b.done + b.failed) / minutes:.1f}/min)"
        )
        if not b.counted:
            parts.append(
                f'<rect x="{x:.2f}" y="{TOP}" width="{bar_w:.2f}" height="{plot_h}" '
                f'fill="#e5e7eb"><title>{text(_label(b.start, step))}: not counted</title></rect>'
            )
            continue
        y = float(TOP + plot_h)
        for count, colour in ((b.done, "#16a34a"), (b.failed, "#dc2626")):
            h = plot_h * (count / minutes) / top
            if h > 0:
                y -= h
                parts.append(
                    f'<rect x="{x:.2f}" y="{y:.2f}" width="{max(bar_w - 1, 0.5):.2f}" '
                    f'height="{h:.2f}" fill="{colour}"><title>{text(label)}</title></rect>'
                )
    for i, anchor in ((0, "start"), (len(rows) // 2, "middle"), (len(rows) - 1, "end")):
        x = LEFT + (i + (anchor == "end")) * bar_w
        label = text(_label(rows[i].start, step))
        parts.append(f'<text x="{x:.1f}" y="{HEIGHT - 5}" text-anchor="{anchor}">{label}</text>')
    parts.append("</svg>")
    return "".join(parts)
