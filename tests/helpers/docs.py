"""The docs as the tests read them: a page's sections, tables, fenced blocks and the HTML
comment that marks a block a test writes; and the switch that makes those tests rewrite what
they generate instead of failing (PGDRAIN_WRITE_DOCS=1)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
WRITE_VARIABLE = "PGDRAIN_WRITE_DOCS"

FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
MARKER = re.compile(r"<!--\s*(.*?)\s*-->\s*\n\Z", re.DOTALL)
HEADING = re.compile(r"^(#{1,6}) +(.+?) *$", re.MULTILINE)
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def pages() -> list[Path]:
    """Every page a reader may open: the README, CONTRIBUTING.md and docs/, decisions included."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted(DOCS.rglob("*.md"))]


def writing() -> bool:
    """Rewrite the generated parts of the docs instead of comparing them."""
    return os.environ.get(WRITE_VARIABLE) == "1"


def rewrite_hint(test: str) -> str:
    return f"{WRITE_VARIABLE}=1 with {test} rewrites it from the code; review the diff"


@dataclass(frozen=True)
class Fence:
    """One fenced code block: its info string, its body, where the body sits in the page's
    text, and the HTML comment on the line just above its opening fence (None: unmarked)."""

    info: str
    body: str
    start: int
    end: int
    marker: str | None


def fences(text: str) -> list[Fence]:
    found = []
    for match in FENCE.finditer(text):
        above = text[: match.start()]
        line_start = above.rfind("\n", 0, len(above) - 1) + 1
        marker = MARKER.search(above[line_start:])
        found.append(
            Fence(
                match.group(1),
                match.group(2),
                match.start(2),
                match.end(2),
                marker.group(1) if marker else None,
            )
        )
    return found


def prose(text: str) -> str:
    """The page without its fenced blocks (a `#` line in a code block is not a heading)."""
    return FENCE.sub("", text)


def section(text: str, title: str) -> str:
    """The text under the heading `title` (any level), up to the next heading of the same level
    or above."""
    body = prose(text)
    headings = list(HEADING.finditer(body))
    for i, heading in enumerate(headings):
        if heading.group(2) != title:
            continue
        level = len(heading.group(1))
        end = next(
            (h.start() for h in headings[i + 1 :] if len(h.group(1)) <= level),
            len(body),
        )
        return body[heading.end() : end]
    raise AssertionError(f"no heading {title!r}")


def split_row(line: str) -> list[str]:
    """A table row's cells; a `|` inside a code span does not end a cell."""
    cells, cell, in_code = [], "", False
    for char in line.strip().strip("|"):
        if char == "`":
            in_code = not in_code
        if char == "|" and not in_code:
            cells.append(cell.strip())
            cell = ""
        else:
            cell += char
    cells.append(cell.strip())
    return cells


def table(text: str) -> list[dict[str, str]]:
    """The first table in `text`, as one mapping of header to cell per row."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    header = split_row(lines[start])
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, split_row(line), strict=True)))
    return rows


def code_spans(text: str) -> list[str]:
    return CODE_SPAN.findall(text)


def slug(title: str) -> str:
    """The anchor GitHub gives a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    seen: dict[str, int] = {}
    for heading in HEADING.finditer(prose(text)):
        base = slug(heading.group(2))
        seen[base] = seen.get(base, -1) + 1
    return {
        base if n == 0 else f"{base}-{n}" for base, count in seen.items() for n in range(count + 1)
    }
