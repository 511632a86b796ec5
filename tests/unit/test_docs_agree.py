"""One set of docs that agrees with the code. Each check reads the code (template.yaml,
pgdrain.settings, the CLI's parser, the benchmark's and the simulator's saved figures) and the
pages, both ways: what the code has and the docs do not, and what the docs name and the code
does not. Each has a control: the same check on a page with one name changed fails.

- docs/lambda.md's tables: every variable each function declares, with what the template sets
  it to; every parameter, with its default; every output.
- Every job status in docs/architecture.md's state diagram and docs/operations.md's table.
- Every PGDRAIN_* variable pgdrain reads is named in the docs; every one named exists.
- Every `pgdrain` command and option the pages show exists (docs/cli.md has them all:
  tests/unit/test_cli_reference.py).
- Every relative link reaches its page and heading.
- docs/benchmarks.md and docs/simulate.md are written from their JSON, and a throughput, ratio,
  import or cold-start figure quoted on another page is one of theirs.
- The kick lines docs/operations.md shows are what the commands print."""

from __future__ import annotations

import ast
import datetime as dt
import re
import shlex
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from helpers import cli_reference
from helpers.docs import (
    DOCS,
    ROOT,
    anchors,
    code_spans,
    fences,
    pages,
    prose,
    section,
    split_row,
    table,
)
from pgdrain.aws import local_invoke
from pgdrain.aws.kick import KickOutcome
from pgdrain.cli.commands import build_parser
from pgdrain.cli.report import format_kick
from pgdrain.db.store import STATUSES
from pgdrain.settings import ENV_VARIABLES

# bench/ and sim/ are top-level packages beside handler/ (as in test_bench_cost.py).
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

LAMBDA = DOCS / "lambda.md"
OPERATIONS = DOCS / "operations.md"
TEMPLATE = ROOT / "template.yaml"
# Each function of the template, and the heading in docs/lambda.md over its variables' table.
FUNCTION_TABLES = {
    "DrainFunction": "Settings",
    "WebDashboardFunction": "The dashboard function's settings",
}


@pytest.fixture(scope="module")
def template() -> dict[str, Any]:
    return local_invoke.load_template(TEMPLATE)


# -- docs/lambda.md: variables, parameters, outputs --------------------------------------------


def template_says(value: Any, template: dict[str, Any]) -> str:
    """How the variables' tables write what the template sets a variable to."""
    if isinstance(value, str):
        return f"`{value}`" if value else "empty"
    if value == {"Ref": "AWS::StackName"}:
        return "the stack's name"
    if "Ref" in value:
        name = value["Ref"]
        return f"`{name}`" if name in template["Parameters"] else f"the `{name}`"
    if "Fn::GetAtt" in value:
        return f"the `{value['Fn::GetAtt'][0]}`"
    if "Fn::If" in value and value["Fn::If"][2] == {"Ref": "AWS::NoValue"}:
        return template_says(value["Fn::If"][1], template)  # set only when its condition holds
    if "Fn::Sub" in value:
        text = str(value["Fn::Sub"])
        return "`" + text.replace("${AWS::StackName}", "<stack>") + "`"
    raise AssertionError(f"no wording for {value!r}")


def variables_table(page: str, heading: str) -> dict[str, dict[str, str]]:
    rows = table(section(page, heading))
    return {row["variable"].strip("`"): row for row in rows}


def variable_problems(page: str, template: dict[str, Any]) -> list[str]:
    problems = []
    functions = {
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::Serverless::Function"
    }
    if missing := functions - set(FUNCTION_TABLES):
        problems.append(f"no table in lambda.md for {sorted(missing)}")
    for function, heading in FUNCTION_TABLES.items():
        declared = template["Resources"][function]["Properties"]["Environment"]["Variables"]
        rows = variables_table(page, heading)
        for name in sorted(declared.keys() - rows.keys()):
            problems.append(f"{function}: {name} is not in the table")
        for name in sorted(rows.keys() - declared.keys()):
            problems.append(f"{function}: {name} is in the table, not in the template")
        for name in sorted(declared.keys() & rows.keys()):
            said, sets = rows[name]["template"], template_says(declared[name], template)
            if said != sets:
                problems.append(f"{function}: {name}: the table says {said}, the template {sets}")
    return problems


def test_the_variables_tables_are_what_the_template_declares(template: dict[str, Any]) -> None:
    page = LAMBDA.read_text()
    assert variable_problems(page, template) == []
    # Every variable pgdrain.settings reads is among them (the template declares each one:
    # test_template.py), so it has a row.
    assert set(ENV_VARIABLES) <= variables_table(page, "Settings").keys()


def test_control_a_variable_misdescribed_missing_or_extra_fails(template: dict[str, Any]) -> None:
    """What the doc said before: POWERTOOLS_SERVICE_NAME set to `pgdrain`; and one variable
    renamed."""
    page = LAMBDA.read_text()
    service = "| `POWERTOOLS_SERVICE_NAME` | `pgdrain` in the log; no metric dimension |"
    wrong = page.replace(f"{service} the stack's name |", f"{service} `pgdrain` |", 1).replace(
        "| `PGDRAIN_RECLAIM_LIMIT` |", "| `PGDRAIN_RECLAIM_LIMITS` |", 1
    )
    assert variable_problems(wrong, template) == [
        "DrainFunction: PGDRAIN_RECLAIM_LIMIT is not in the table",
        "DrainFunction: PGDRAIN_RECLAIM_LIMITS is in the table, not in the template",
        "DrainFunction: POWERTOOLS_SERVICE_NAME: the table says `pgdrain`, the template the "
        "stack's name",
    ]


def default_says(spec: dict[str, Any]) -> str:
    default = spec.get("Default", "")
    return f"`{default}`" if default != "" else "empty"


def parameter_problems(page: str, template: dict[str, Any]) -> list[str]:
    rows = {row["parameter"].strip("`"): row for row in table(section(page, "Parameters"))}
    parameters = template["Parameters"]
    problems = [f"{p} is not in the table" for p in sorted(parameters.keys() - rows.keys())]
    problems += [f"{p} is not a parameter" for p in sorted(rows.keys() - parameters.keys())]
    for name in sorted(parameters.keys() & rows.keys()):
        if rows[name]["default"] != default_says(parameters[name]):
            said, default = rows[name]["default"], default_says(parameters[name])
            problems.append(f"{name}: default {said}, template {default}")
    # A parameter that sets a variable says which.
    for function in FUNCTION_TABLES:
        declared = template["Resources"][function]["Properties"]["Environment"]["Variables"]
        for variable, value in declared.items():
            name = value.get("Ref") if isinstance(value, dict) else None
            if name in rows and f"`{variable}`" not in rows[name]["meaning"]:
                problems.append(f"{name}: its row does not name {variable}")
    return problems


def test_the_parameters_table_is_the_templates(template: dict[str, Any]) -> None:
    assert parameter_problems(LAMBDA.read_text(), template) == []


def test_control_a_parameter_missing_or_with_another_default_fails(
    template: dict[str, Any],
) -> None:
    page = LAMBDA.read_text()
    wrong = page.replace("| `Tracing` | `PassThrough` |", "| `Tracing` | `Active` |", 1)
    wrong = re.sub(r"\| `AlarmEmail` \|[^\n]*\n", "", wrong, count=1)
    wrong = wrong.replace(
        "| `JobsModule` | `jobs` | `PGDRAIN_JOBS` |", "| `JobsModule` | `jobs` | the jobs |", 1
    )
    assert parameter_problems(wrong, template) == [
        "AlarmEmail is not in the table",
        "Tracing: default `Active`, template `PassThrough`",
        "JobsModule: its row does not name PGDRAIN_JOBS",
    ]


def output_problems(page: str, template: dict[str, Any]) -> list[str]:
    rows = {row["output"].strip("`") for row in table(section(page, "Outputs"))}
    outputs = set(template["Outputs"])
    return [f"{o} is not in the table" for o in sorted(outputs - rows)] + [
        f"{o} is not an output" for o in sorted(rows - outputs)
    ]


def test_the_outputs_table_is_the_templates(template: dict[str, Any]) -> None:
    assert output_problems(LAMBDA.read_text(), template) == []


def test_control_an_output_missing_or_extra_fails(template: dict[str, Any]) -> None:
    page = LAMBDA.read_text().replace("| `DashboardName` |", "| `DashboardUrl` |", 1)
    assert output_problems(page, template) == [
        "DashboardName is not in the table",
        "DashboardUrl is not an output",
    ]


# -- job states: the schema's, in the state diagram and the states table ----------------------

ARCHITECTURE = DOCS / "architecture.md"


def diagram_states(text: str) -> set[str]:
    (diagram,) = [f.body for f in fences(text) if f.body.lstrip().startswith("stateDiagram")]
    return set(re.findall(r"^\s*(\w+) --> ", diagram, re.MULTILINE)) | set(
        re.findall(r"--> (\w+)", diagram)
    )


def test_every_job_status_is_in_the_diagram_and_the_states_table() -> None:
    statuses = set(STATUSES)
    assert diagram_states(ARCHITECTURE.read_text()) == statuses
    rows = table(section(OPERATIONS.read_text(), "Job states"))
    assert {row["status"].strip("`") for row in rows} == statuses


def test_control_a_diagram_without_a_status_fails() -> None:
    """What architecture.md's diagram was before: no parked, no cancelled, no waiting."""
    text = re.sub(
        r"^.*(parked|cancelled|waiting).*\n", "", ARCHITECTURE.read_text(), flags=re.MULTILINE
    )
    assert set(STATUSES) - diagram_states(text) == {"parked", "cancelled", "waiting"}


# -- PGDRAIN_* variables: the package's and the docs' ------------------------------------------

VARIABLE = re.compile(r"\bPGDRAIN_[A-Z0-9_]*[A-Z0-9]\b")


def read_by_the_package() -> set[str]:
    """Every PGDRAIN_* name the package holds as a string (what it reads from the environment)."""
    names = set()
    for path in (ROOT / "handler" / "pgdrain").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if re.fullmatch(r"PGDRAIN_[A-Z0-9_]+", node.value):
                    names.add(node.value)
    return names


def in_the_repository() -> str:
    """Every file that may read a variable: the package, its tests, bench, sim, the build."""
    files = [TEMPLATE, ROOT / "Makefile"]
    for folder in ("handler", "tests", "bench", "sim", "infra"):
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".json", ".sh")]
    return "\n".join(p.read_text() for p in files if p.is_file())


def variable_name_problems(docs: str, package: set[str], repository: str) -> list[str]:
    named = set(VARIABLE.findall(docs))
    existing = set(VARIABLE.findall(repository))
    return [f"{v} is read but not documented" for v in sorted(package - named)] + [
        f"{v} is documented but read nowhere" for v in sorted(named - existing)
    ]


def all_pages() -> str:
    return "\n".join(p.read_text() for p in pages())


def test_every_pgdrain_variable_is_documented_and_exists() -> None:
    package = read_by_the_package()
    assert {"PGDRAIN_QUEUES", "PGDRAIN_DATA_DIR", "PGDRAIN_UI_SECRET"} <= package
    assert variable_name_problems(all_pages(), package, in_the_repository()) == []


def test_control_an_undocumented_or_invented_variable_fails() -> None:
    package = read_by_the_package() | {"PGDRAIN_NOT_DOCUMENTED"}
    invented = "PGDRAIN_" + "INVENTED"  # not spelt whole: this file is in the repository
    docs = all_pages() + f"\nSet `{invented}=1`."
    assert variable_name_problems(docs, package, in_the_repository()) == [
        "PGDRAIN_NOT_DOCUMENTED is read but not documented",
        f"{invented} is documented but read nowhere",
    ]


# -- the commands and options the pages show ---------------------------------------------------

# Blocks whose lines are not commands.
NOT_COMMANDS = {"text", "json", "python", "yaml", "mermaid", "sql"}


def shown_commands(text: str) -> Iterator[str]:
    """Command lines in the page's shell blocks (a console block's `$` lines) and code spans."""
    for block in fences(text):
        if block.info in NOT_COMMANDS:
            continue
        for line in block.body.splitlines():
            if block.info == "console":
                if line.startswith("$ "):
                    yield line[2:]
            else:
                yield line
    yield from code_spans(prose(text))


def command_words(line: str, commands: set[str]) -> list[str] | None:
    """The words after `pgdrain` when the line runs it (after any NAME=value), or the line's
    words when it names a command with options without `pgdrain` (`retry --failed`)."""
    raw = line.split()
    while raw and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", raw[0]):
        raw = raw[1:]
    if not raw:
        return None
    try:
        words = shlex.split(" ".join(raw), comments=True)
    except ValueError:  # a line cut in the middle of a quote
        words = raw
    if raw[0] == "pgdrain" or raw[0].endswith("/pgdrain"):
        return words[1:]
    if raw[0] in commands and any(w.startswith("--") for w in words):
        return words
    return None


def command_problems(text: str) -> list[str]:
    root = build_parser()
    commands = set(cli_reference.subcommands(root))
    problems = []
    for line in shown_commands(text):
        words = command_words(line, commands)
        if words is None:
            continue
        parser, path = root, "pgdrain"
        for word in words:
            subs = cli_reference.subcommands(parser)
            if word in subs:
                parser, path = subs[word], f"{path} {word}"
            elif word.startswith("-") and not re.fullmatch(r"-[\d.]*", word):  # not -, -1
                flag = word.split("=", 1)[0]
                if flag not in cli_reference.options(parser):
                    problems.append(f"{path} has no {flag} (in {line!r})")
            elif parser is root:
                problems.append(f"pgdrain has no command {word!r} (in {line!r})")
                break
    return problems


# docs/cli.md is the parser written out (test_cli_reference.py).
SHOWING_COMMANDS = [p for p in pages() if p != DOCS / "cli.md"]


@pytest.mark.parametrize("page", SHOWING_COMMANDS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_and_option_shown_exists(page: Path) -> None:
    assert command_problems(page.read_text()) == []


def test_control_an_option_or_command_that_does_not_exist_fails() -> None:
    text = (
        "```sh\npgdrain drain --budget 30 --queue emails  # one\n```\n"
        "Then `retry --failed --dry` or `pgdrain jobs show 42 --json`, and `pgdrain purge-all`.\n"
    )
    assert command_problems(text) == [
        "pgdrain drain has no --queue (in 'pgdrain drain --budget 30 --queue emails  # one')",
        "pgdrain retry has no --dry (in 'retry --failed --dry')",
        "pgdrain has no command 'purge-all' (in 'pgdrain purge-all')",
    ]


# -- links -------------------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def link_problems(page: Path, text: str) -> list[str]:
    problems = []
    for target in LINK.findall(prose(text)):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            problems.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked.read_text()):
            problems.append(f"{target}: no such heading")
    return problems


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_reaches_its_page_and_heading(page: Path) -> None:
    assert link_problems(page, page.read_text()) == []


def test_control_a_link_to_a_missing_heading_or_page_fails() -> None:
    text = "[a](benchmarks.md#cost) [b](benchmarks.md#costs) [c](nowhere.md) [d](#the-end)"
    assert link_problems(DOCS / "lambda.md", text) == [
        "benchmarks.md#costs: no such heading",
        "nowhere.md: no such file",
        "#the-end: no such heading",
    ]


# -- figures: measured once, quoted from there -------------------------------------------------


def rendered_benchmarks() -> str:
    from bench import report, run

    return report.markdown(run.load(DOCS / "benchmarks.json"), "benchmarks.png")


def rendered_simulate(tmp_path: Path) -> str:
    from sim import report

    figures, meta = report.read_json(DOCS / "simulate.json")
    report.write_markdown(tmp_path / "simulate.md", figures, meta)
    return (tmp_path / "simulate.md").read_text()


def test_the_figure_pages_are_written_from_their_json(tmp_path: Path) -> None:
    """`make bench` and `make simulate` save their figures as JSON and write the page from
    them: the pages hold nothing else (their --render options write them again)."""
    assert (DOCS / "benchmarks.md").read_text() == rendered_benchmarks()
    assert (DOCS / "simulate.md").read_text() == rendered_simulate(tmp_path)


def test_control_a_figure_edited_by_hand_fails() -> None:
    page = (DOCS / "benchmarks.md").read_text()
    edited = page.replace(
        "| pgdrain | default: batch 10, concurrency 10 | ",
        "| pgdrain | default: batch 10, concurrency 10 | 1",
        1,
    )
    assert edited != page
    assert edited != rendered_benchmarks()


THROUGHPUT = re.compile(r"(\d[\d,]*(?:\.\d+)?)(?= (?:no-op )?jobs/s)")
RATIO = re.compile(r"(?<![\w.])(\d+\.\d+)x\b")
TIMING = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?) ?(?:ms|s)\b")
ABOUT_STARTING = re.compile(r"\bimport|cold start", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.;])\s+(?=[A-Z(`])")
# A table row whose first cell names a rate: each of its figures with a thousands separator.
RATE_ROW = re.compile(r"per second|jobs/s", re.IGNORECASE)
GROUPED = re.compile(r"(?<![\w.,])\d{1,3}(?:,\d{3})+(?!\d|,\d)")
# Pages that state figures of their own: the measured pages, and the decision records, each
# with where and when it measured (docs/decisions/README.md).
MEASURED = {DOCS / "benchmarks.md", DOCS / "simulate.md"}


def quoted_figures(text: str) -> list[str]:
    """Throughput (jobs/s, and a rate row's figures), ratios (1.02x) and import or cold-start
    times a page states."""
    figures = []
    for line in prose(text).splitlines():
        if line.startswith("|") and RATE_ROW.search(split_row(line)[0]):
            figures += GROUPED.findall(" ".join(split_row(line)[1:]))
    for paragraph in re.split(r"\n\s*\n", prose(text)):
        flat = " ".join(paragraph.split())
        figures += THROUGHPUT.findall(flat) + RATIO.findall(flat)
        for sentence in SENTENCE_END.split(flat):
            if ABOUT_STARTING.search(sentence):
                figures += TIMING.findall(sentence)
    return figures


def unmeasured(figures: list[str], measured: str) -> list[str]:
    return [f for f in figures if not re.search(rf"(?<![\d.,]){re.escape(f)}(?!\d)", measured)]


def quoting_pages() -> list[Any]:
    found = []
    for page in pages():
        if page in MEASURED or "decisions" in page.parts:
            continue
        found.append(pytest.param(page, id=str(page.relative_to(ROOT))))
    return found


@pytest.mark.parametrize("page", quoting_pages())
def test_figures_quoted_outside_the_measured_pages_are_the_measured_ones(
    page: Path, tmp_path: Path
) -> None:
    measured = rendered_benchmarks() + rendered_simulate(tmp_path)
    assert unmeasured(quoted_figures(page.read_text()), measured) == []


def _not_in(measured: str, start: int, written: Callable[[int], str]) -> str:
    """The first figure from `start` up that the measured pages do not state: a figure of an
    earlier run, whatever the latest run measured."""
    n = start
    while not unmeasured([written(n)], measured):
        n += 1
    return written(n)


def test_control_figures_from_an_earlier_run_fail(tmp_path: Path) -> None:
    """What README.md and deploy.md said before: two throughputs from one paragraph, a ratio
    and an import time that no longer match the run benchmarks.md holds, beside a throughput
    and a ratio that do."""
    measured = rendered_benchmarks() + rendered_simulate(tmp_path)
    flat = " ".join(prose(measured).split())
    rate, ratio = THROUGHPUT.findall(flat)[0], RATIO.findall(flat)[0]
    old_rate = _not_in(measured, 14227, lambda n: f"{n:,}")
    other_rate = _not_in(measured, 12464, lambda n: f"{n:,}")
    old_ratio = _not_in(measured, 107, lambda n: f"{n / 100:.2f}")
    old_import = _not_in(measured, 135, str)
    old_start = _not_in(measured, 176, lambda n: f"0.{n:03d}")
    text = (
        f"One drain process reaches {old_ratio}x its SQL ceiling: {old_rate} no-op jobs/s at "
        f"the default batch; 1,000,000 / {other_rate} jobs/s = 80.2 s.\n\n"
        f"`import app` takes {old_import} ms; a cold start {old_start} s.\n\n"
        f"It reaches {ratio}x its ceiling, {rate} jobs/s."
    )
    stale = [old_rate, other_rate, old_ratio, old_import, old_start]
    assert quoted_figures(text) == [*stale, rate, ratio]
    assert unmeasured(quoted_figures(text), measured) == stale


def test_control_a_rate_row_from_an_earlier_run_fails(tmp_path: Path) -> None:
    """What README.md's comparison said before: a row of jobs drained per second, its figures
    without "jobs/s" beside them, from an earlier run than the one benchmarks.md holds."""
    measured = rendered_benchmarks() + rendered_simulate(tmp_path)
    rate = THROUGHPUT.findall(" ".join(prose(measured).split()))[0]
    old_rate = _not_in(measured, 13014, lambda n: f"{n:,}")
    row = f"| No-op jobs drained per second | {old_rate} at batch 10, {rate} at batch 1000 | 833 |"
    assert quoted_figures(row) == [old_rate, rate]
    assert unmeasured(quoted_figures(row), measured) == [old_rate]


# -- the kick lines docs/operations.md shows ---------------------------------------------------


def test_the_kick_lines_are_what_the_commands_print() -> None:
    """The four lines `enqueue` and `retry` may print about a kick, from format_kick."""
    block = next(f.body for f in fences(OPERATIONS.read_text()) if f.body.startswith("kicked "))
    wake = dt.datetime(2026, 12, 1, 14, 6, tzinfo=dt.UTC)
    printed = [
        line
        for outcome in (
            KickOutcome("pgdrain-drain", invoked=("emails",)),
            KickOutcome("pgdrain-drain", wakes=((("emails",), wake),)),
            KickOutcome("pgdrain-drain", covered=("emails",)),
            KickOutcome("pgdrain-drain", error="…"),
        )
        for line in format_kick(outcome)
    ]
    assert block.splitlines() == printed
