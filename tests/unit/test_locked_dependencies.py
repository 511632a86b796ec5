"""What `sam build` installs into the function is locked: handler/requirements.txt pins every
package with its hashes (`make lock` makes it from handler/requirements.in's ranges), so a
deploy installs what the tests ran, not whatever is newest that day. psycopg is capped at what
db/pipeline.py's use of its private parts was tested with, and if those parts change anyway,
importing pgdrain fails at once, in one line, instead of a run's first statement in
production. The suite runs on the locked set: the Makefile installs it (hashes checked) before
the dev extras, and the first test here fails when the environment drifted from it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import tomllib
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from pgdrain.db import pipeline

ROOT = Path(__file__).resolve().parents[2]
LOCK = ROOT / "handler" / "requirements.txt"
RANGES = ROOT / "handler" / "requirements.in"
# The function's own code talks to these; their versions are the tested ones.
TALKED_TO = ("psycopg", "psycopg-binary", "aws-lambda-powertools")


def _locked() -> dict[str, tuple[str, list[str]]]:
    """{name: (version, hashes)} of the lock."""
    entries: dict[str, tuple[str, list[str]]] = {}
    for block in re.split(r"\n(?=[A-Za-z])", LOCK.read_text()):
        head = block.split("\\", 1)[0].strip()
        if not head or head.startswith("#"):
            continue
        name, _, version = head.partition("==")
        hashes = re.findall(r"--hash=sha256:([0-9a-f]{64})", block)
        entries[name.strip().lower()] = (version.strip(), hashes)
    return entries


def _ranges() -> list[Requirement]:
    lines = [line.strip() for line in RANGES.read_text().splitlines()]
    return [Requirement(line) for line in lines if line and not line.startswith("#")]


def test_the_environment_runs_the_locked_versions() -> None:
    locked = _locked()
    for name in TALKED_TO:
        assert metadata.version(name) == locked[name][0], (
            f"{name} {metadata.version(name)} is installed, the function gets {locked[name][0]}:"
            " install the lock (as make does: pip install --require-hashes -r"
            " handler/requirements.txt)"
        )


def test_every_package_is_pinned_with_its_hashes() -> None:
    locked = _locked()
    assert set(locked) == {*TALKED_TO, "jmespath", "typing-extensions"}  # no boto3: the runtime's
    for name, (version, hashes) in locked.items():
        assert re.fullmatch(r"\d+(\.\d+)+", version), (name, version)
        assert hashes, f"{name} has no hash"
    # The arm64 wheel the function runs is among psycopg-binary's: one per platform and Python.
    assert len(locked["psycopg-binary"][1]) > 10


def test_the_lock_is_within_the_ranges_and_the_ranges_are_the_packages() -> None:
    locked = _locked()
    ranges = {r.name: r for r in _ranges()}
    for name, requirement in ranges.items():
        assert requirement.specifier.contains(locked[name][0]), (name, locked[name][0])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert sorted(str(r) for r in ranges.values()) == sorted(
        str(Requirement(d)) for d in project["dependencies"]
    )
    assert ranges["psycopg"].specifier == SpecifierSet(pipeline.TESTED_PSYCOPG)
    assert SpecifierSet(pipeline.TESTED_PSYCOPG).contains(locked["psycopg"][0])


# -- psycopg's private parts changed -------------------------------------------------------------

CHANGED_QUERY = """
import psycopg._queries as queries

class PostgresQuery:  # as a release that renamed convert() might have it
    def __init__(self, transformer):
        self.query = b""

    def prepare(self, query, vars):
        pass

queries.PostgresQuery = PostgresQuery
"""
GONE_MODULE = """
import sys
import psycopg
del sys.modules["psycopg._queries"]
sys.modules["psycopg._queries"] = None  # the private module moved
"""


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT / "handler"), "PATH": "/usr/bin:/bin"},
        check=False,
    )


@pytest.mark.parametrize("change", [CHANGED_QUERY, GONE_MODULE], ids=["changed", "gone"])
def test_a_changed_psycopg_fails_the_import_in_one_line(change: str) -> None:
    done = _python(change + "\nimport pgdrain.db.session\n")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("pgdrain.db.pipeline.PsycopgChanged: pgdrain drives psycopg's private")
    assert "tested with psycopg >=3.2,<3.4" in last and "requirements.txt" in last


def test_control_without_the_check_the_import_succeeds_and_a_run_fails_later() -> None:
    """The control: pgdrain imported before psycopg changed (so its check saw nothing): the
    import succeeds, a cold start looks fine, and the failure waits for the first statement,
    in production. The check, run then, names it."""
    code = """
import pgdrain.db.pipeline as pipeline
print("imported")
import psycopg._queries as queries
exec(CHANGED, {})
pipeline.PostgresQuery = queries.PostgresQuery
from psycopg.adapt import Transformer
try:
    pipeline.PostgresQuery(Transformer()).convert("SELECT %(a)s", {"a": 1})  # Pipeline.send's
except AttributeError as exc:
    print("first statement:", exc)
try:
    pipeline.check_psycopg()
except pipeline.PsycopgChanged as exc:
    print("checked:", str(exc).split(" (")[1].split(")")[0])
""".replace("CHANGED", repr(CHANGED_QUERY))
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "imported",
        "first statement: 'PostgresQuery' object has no attribute 'convert'",
        "checked: PostgresQuery.convert: AttributeError: 'PostgresQuery' object has no"
        " attribute 'convert'",
    ]
