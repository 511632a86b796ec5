"""The sample outputs in the docs are what the commands print. Every console block marked
`<!-- transcript -->` in a page below is run command by command, as a user runs them: the
`pgdrain` command in a fresh process, from a directory holding the page's jobs module (its
python block marked `<!-- jobs module of the transcripts -->`), against a fresh migrated
database shared by the page's blocks in their order; stdout and stderr as a terminal shows
them. Each output must be the block's, up to what changes from run to run (dates and times,
durations, fractional figures, uuids). The `--json` outputs in docs/operations.md must also
have the fields its tables list, and only those.

PGDRAIN_WRITE_DOCS=1 rewrites the blocks from the run instead of comparing them."""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import scratch_database

from helpers.cli import ROOT, TIMEOUT_SECONDS
from helpers.docs import Fence, fences, rewrite_hint, section, table, writing

PAGES = ("README.md", "docs/operations.md")
TRANSCRIPT = "transcript"
JOBS_MODULE = "jobs module of the transcripts"
PROMPT = "$ "
# Where the transcripts say the jobs module is (tracebacks name its file).
SHOWN_DIRECTORY = "/home/you/app"
THIS_TEST = "tests/acceptance/test_doc_transcripts.py"

VARYING = [
    (re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d(:\d\d(\.\d+)?)?( ?UTC|[+-]\d\d:\d\d)?"), "<time>"),
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "<uuid>"),
    (re.compile(r"\b\d+(\.\d+)? ?(ms|s|m|h|d)\b"), "<duration>"),
    (re.compile(r"\b\d+\.\d+\b"), "<number>"),
]


@dataclass(frozen=True)
class Step:
    command: str  # as the page writes it, after the prompt
    output: tuple[str, ...]


def steps(body: str) -> list[Step]:
    found: list[Step] = []
    for line in body.splitlines():
        if line.startswith(PROMPT):
            found.append(Step(line[len(PROMPT) :], ()))
        else:
            assert found, f"output before the first command: {line!r}"
            last = found.pop()
            found.append(Step(last.command, (*last.output, line)))
    return found


def render(done: list[Step]) -> str:
    return "".join(
        f"{PROMPT}{step.command}\n" + "".join(f"{line}\n" for line in step.output) for step in done
    )


def normalised(done: list[Step]) -> list[str]:
    lines = []
    for step in done:
        lines.append(f"{PROMPT}{step.command}")
        for line in step.output:
            for pattern, placeholder in VARYING:
                line = pattern.sub(placeholder, line)
            lines.append(" ".join(line.split()))
    return lines


def differences(documented: list[Step], printed: list[Step]) -> str:
    """A unified diff of what differs beyond the varying parts; empty when nothing does."""
    said, was = normalised(documented), normalised(printed)
    if said == was:
        return ""
    return "\n".join(difflib.unified_diff(said, was, "the page", "the commands", lineterm=""))


@dataclass(frozen=True)
class Page:
    path: Path
    text: str
    jobs_module: str
    blocks: list[Fence]


def read_page(name: str) -> Page:
    path = ROOT / name
    text = path.read_text()
    blocks = [f for f in fences(text) if f.marker == TRANSCRIPT]
    modules = [f.body for f in fences(text) if f.marker == JOBS_MODULE]
    assert blocks and len(modules) == 1, f"{name}: transcripts and one jobs module"
    assert all(b.info == "console" for b in blocks)
    return Page(path, text, modules[0], blocks)


def pgdrain(command: str, url: str, cwd: Path) -> tuple[str, ...]:
    argv = shlex.split(command, comments=True)
    assert argv[0] == "pgdrain", command
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
    env.update(
        DATABASE_URL=url,
        PYTHONPATH=str(ROOT / "handler"),
        PYTHONUNBUFFERED="1",  # stdout and stderr in the order a terminal shows them
    )
    done = subprocess.run(
        [sys.executable, "-m", "pgdrain.cli", *argv[1:]],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )
    text = done.stdout.decode("utf-8", "replace").replace(str(cwd), SHOWN_DIRECTORY)
    return tuple(text.splitlines())


def run_page(name: str, admin_url: str, template_db: str, folder: Path) -> list[list[Step]]:
    page = read_page(name)
    (folder / "jobs.py").write_text(page.jobs_module)
    with scratch_database(admin_url, "pgdrain_doc", template_db) as url:
        return [
            [Step(s.command, pgdrain(s.command, url, folder)) for s in steps(block.body)]
            for block in page.blocks
        ]


@pytest.fixture(scope="module")
def printed(
    admin_url: str, template_db: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, list[list[Step]]]:
    """Each page's transcripts as the commands print them: page name -> block -> steps. The
    pages run side by side: each has its own database and directory."""
    with ThreadPoolExecutor(len(PAGES)) as pool:
        runs = {
            name: pool.submit(
                run_page, name, admin_url, template_db, tmp_path_factory.mktemp("transcripts")
            )
            for name in PAGES
        }
        return {name: run.result() for name, run in runs.items()}


@pytest.mark.parametrize("name", PAGES)
def test_every_transcript_is_what_the_commands_print(
    name: str, printed: dict[str, list[list[Step]]]
) -> None:
    page = read_page(name)
    if writing():
        text = page.text
        for block, done in reversed(list(zip(page.blocks, printed[name], strict=True))):
            text = text[: block.start] + render(done) + text[block.end :]
        page.path.write_text(text)
        return
    problems = [
        diff
        for block, done in zip(page.blocks, printed[name], strict=True)
        if (diff := differences(steps(block.body), done))
    ]
    assert not problems, "\n\n".join(problems) + f"\n({rewrite_hint(THIS_TEST)})"


def test_control_a_count_that_differs_fails_and_times_do_not(
    printed: dict[str, list[list[Step]]],
) -> None:
    """The same printed transcript, against a page with one count changed, then against one
    with every time changed: the first differs, the second does not."""
    done = printed["README.md"][0]
    drain = next(i for i, s in enumerate(done) if s.command.startswith("pgdrain drain"))
    summary = done[drain].output[-1]
    assert summary.startswith("claimed 100, done 100,"), summary

    def with_summary(line: str) -> list[Step]:
        changed = list(done)
        changed[drain] = Step(done[drain].command, (*done[drain].output[:-1], line))
        return changed

    assert "claimed 99" in differences(
        with_summary(summary.replace("claimed 100", "claimed 99")), done
    )
    slower = re.sub(r"after [0-9.]+s", "after 12.345s", summary)
    assert slower != summary
    assert differences(with_summary(slower), done) == ""


# -- the --json outputs against the fields docs/operations.md lists ---------------------------


def json_outputs(name: str, printed: dict[str, list[list[Step]]]) -> dict[str, object]:
    """The first JSON output of each command (its first word after `pgdrain`)."""
    found: dict[str, object] = {}
    for block in printed[name]:
        for step in block:
            if "--json" in step.command:
                command = shlex.split(step.command)[1]
                found.setdefault(command, json.loads(step.output[0]))  # then any error line
    return found


def names(text: str) -> set[str]:
    """The field names in backticks, less those in parentheses (values, nested fields)."""
    return set(re.findall(r"`([a-z_]+)`", re.sub(r"\([^)]*\)", "", text)))


def documented_fields(text: str) -> dict[str, set[str]]:
    json_section = section(text, "`--json` output (stable: fields are only ever added)")
    jobs = json_section.split("`pgdrain jobs --json`", 1)[1].split("\n\n", 1)[0]
    fields = {
        "stats": {name for row in table(json_section) for name in names(row["field"])},
        "jobs": names(jobs),
    }
    fixing = section(text, "Fixing")
    for row in table(fixing.split("prints one object instead:", 1)[1]):
        fields[row["command"].strip("`")] = names(row["fields"])
    return fields


def printed_fields(outputs: dict[str, object]) -> dict[str, set[str]]:
    fields: dict[str, set[str]] = {}
    for command, value in outputs.items():
        objects = value if isinstance(value, list) else [value]
        assert objects and all(isinstance(o, dict) for o in objects), (command, value)
        fields[command] = {key for o in objects if isinstance(o, dict) for key in o}
    return fields


def test_the_json_outputs_have_the_documented_fields(
    printed: dict[str, list[list[Step]]],
) -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    was = printed_fields(json_outputs("docs/operations.md", printed))
    assert set(was) == {"stats", "jobs", "retry", "cancel", "purge", "pause", "resume"}
    assert documented_fields(text) == was


def test_control_a_field_left_out_of_the_table_fails(
    printed: dict[str, list[list[Step]]],
) -> None:
    text = (ROOT / "docs" / "operations.md").read_text()
    left_out = text.replace("`dry_run`, `deleted` (or would delete), ", "`dry_run`, ", 1)
    assert left_out != text
    was = printed_fields(json_outputs("docs/operations.md", printed))
    said = documented_fields(left_out)
    assert was["purge"] - said["purge"] == {"deleted"}
