"""HTML for the dashboard: every value from a job (payload, error, traceback, kind, queue) goes
through text(), which escapes it, shows control characters, NUL, lone surrogates (undecodable
bytes) and bidirectional overrides as visible escapes, and cuts what is too long with a marker.
The page carries a Content-Security-Policy that allows no script at all."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import urlencode

# What one table cell shows of a value; a job's own page shows up to MAX_TEXT.
MAX_CELL = 160
MAX_TEXT = 64 * 1024

# C0 and C1 controls (tab and newline kept), DEL, the "Trojan Source" bidirectional controls,
# and lone surrogates (how Python carries bytes that were not UTF-8): shown as escapes.
_INVISIBLE = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)


def _visible(ch: re.Match[str]) -> str:
    return ch.group().encode("unicode_escape").decode("ascii")


def text(value: object, limit: int = MAX_TEXT) -> str:
    """`value` as HTML text: escaped (quotes too, so it is safe in an attribute), made visible,
    and cut after `limit` characters with a marker saying how many more there were."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "backslashreplace")
    s = value if isinstance(value, str) else str(value)
    cut = ""
    if len(s) > limit:
        cut = f' <span class="cut">[… {len(s) - limit:,} more characters not shown]</span>'
        s = s[:limit]
    return html.escape(_INVISIBLE.sub(_visible, s), quote=True) + cut


def cell(value: object) -> str:
    return "-" if value is None else text(value, MAX_CELL)


def exact(value: object, limit: int = MAX_CELL) -> str:
    """A value compared exactly (a kind) as text: in quotes when it begins or ends with a
    space, so that "send " and "send" differ on sight."""
    if value is None:
        return "-"
    if isinstance(value, str) and value != value.strip():
        return f"&quot;{text(value, limit)}&quot;"
    return text(value, limit)


def pretty_json(value: object) -> str:
    """A JSON value indented, as escaped text (for a <pre>)."""
    return text(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=True))


def url(path: str, params: Mapping[str, object] | None = None) -> str:
    """A link into the dashboard, escaped for an attribute. `path` is ours; the parameters
    (which may be job data) are percent-encoded."""
    query = {k: str(v) for k, v in (params or {}).items() if v not in (None, "")}
    return html.escape(path + ("?" + urlencode(query) if query else ""), quote=True)


def moment(value: object) -> str:
    """A time in UTC, to the second. Anything else (a job's error record may hold any JSON, a
    time with no UTC form such as year 1 at +05:00) is shown as its text, never raised."""
    if value is None:
        return "-"
    if not isinstance(value, dt.datetime | str):
        return text(json.dumps(value, ensure_ascii=False, default=str), MAX_CELL)
    try:
        when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(value)
        return when.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (ValueError, OverflowError):
        return text(value, MAX_CELL)


def duration(seconds: float) -> str:
    """3s, 4m 05s, 2h 03m, 3d 04h."""
    s = int(abs(seconds))
    if s < 60:
        out = f"{s}s"
    elif s < 3600:
        out = f"{s // 60}m {s % 60:02d}s"
    elif s < 86400:
        out = f"{s // 3600}h {s % 3600 // 60:02d}m"
    else:
        out = f"{s // 86400}d {s % 86400 // 3600:02d}h"
    return ("-" if seconds < 0 else "") + out


def table(headers: Sequence[str], rows: Iterable[Sequence[str]], empty: str) -> str:
    """A table of cells that are already HTML (escaped by the caller)."""
    head = "".join(f"<th>{h}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    if not body:
        body = f'<tr><td colspan="{len(headers)}" class="empty">{empty}</td></tr>'
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def hidden(fields: Mapping[str, object]) -> str:
    return "".join(
        f'<input type="hidden" name="{text(k)}" value="{text(v)}">'
        for k, v in fields.items()
        if v not in (None, "")
    )


def post_button(action: str, label: str, token: str, fields: Mapping[str, object]) -> str:
    """A form that POSTs `fields` and the CSRF token to `action` (escaped, ours)."""
    return (
        f'<form method="post" action="{url(action)}" class="inline">'
        f"{hidden({**fields, 'token': token})}"
        f'<button type="submit">{label}</button></form>'
    )


STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 20px;display:flex;gap:24px;align-items:center}
header a{color:#cdd6e4;text-decoration:none}header a.on{color:#fff;font-weight:600}
header .brand{font-weight:700;color:#fff;margin-right:12px}
main{padding:16px 20px;max-width:1400px}
h1{font-size:20px;margin:4px 0 12px}h2{font-size:16px;margin:20px 0 8px}
table{border-collapse:collapse;background:#fff;width:100%;margin-bottom:8px}
th,td{border-bottom:1px solid #e3e6eb;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600;white-space:nowrap}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.empty{color:#6b7280;font-style:italic}
pre{background:#fff;border:1px solid #e3e6eb;padding:8px;overflow:auto;max-height:480px;
white-space:pre-wrap;word-break:break-all}
.cut{color:#9a3412;font-style:italic}
.status-failed,.status-parked{color:#b91c1c;font-weight:600}
.status-running{color:#1d4ed8}.status-done{color:#15803d}.status-cancelled{color:#6b7280}
.notice{background:#ecfdf5;border:1px solid #a7f3d0;padding:8px 12px;margin-bottom:12px}
.error{background:#fef2f2;border:1px solid #fecaca;padding:8px 12px;margin-bottom:12px}
.confirm{background:#fffbeb;border:1px solid #fde68a;padding:12px;margin:12px 0}
.not-kept{background:#fffbeb;border:1px solid #fde68a;padding:8px 12px;margin-bottom:12px}
form.inline{display:inline}form.filters{margin-bottom:12px}
form.filters label{margin-right:10px}
button{font:inherit;padding:4px 12px;cursor:pointer}
.muted{color:#6b7280}.charts{display:flex;flex-wrap:wrap;gap:16px}
.chart{background:#fff;border:1px solid #e3e6eb;padding:8px}.chart svg{display:block;margin-top:4px}
svg text{font:11px system-ui,sans-serif;fill:#4b5563}
dl{display:grid;grid-template-columns:max-content auto;gap:2px 16px;background:#fff;
padding:8px;border:1px solid #e3e6eb}dt{font-weight:600}dd{margin:0;word-break:break-all}
"""

NAV = (("/", "Queues"), ("/jobs", "Jobs"), ("/control", "Control plane"))


def page(title: str, body: str, *, active: str, refresh: int | None = None) -> tuple[str, str]:
    """A whole page and the Content-Security-Policy that goes with it: no script, no frames,
    nothing loaded from anywhere, styles from this page's own nonce only."""
    nonce = secrets.token_urlsafe(16)
    nav = "".join(
        f'<a href="{href}"{" class=on" if href == active else ""}>{label}</a>'
        for href, label in NAV
    )
    meta = f'<meta http-equiv="refresh" content="{int(refresh)}">' if refresh else ""
    document = (
        "<!doctype html>\n"
        f'<html lang="en"><head><meta charset="utf-8">{meta}'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{text(title)} · pgdrain</title>"
        f'<style nonce="{nonce}">{STYLE}</style></head>'
        f'<body><header><span class="brand">pgdrain</span>{nav}</header>'
        f"<main>{body}</main></body></html>"
    )
    policy = (
        "default-src 'none'; "
        f"style-src 'nonce-{nonce}'; "
        "img-src 'self'; "
        "form-action 'self'; "
        "frame-ancestors 'none'; "
        "base-uri 'none'"
    )
    return document, policy
