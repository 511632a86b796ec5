"""The package as a user gets it: the wheel holds the library (and the project `pgdrain init`
writes) and nothing else, and installed by the README's own install line into a fresh
virtualenv outside the repository (without extras), the README's quick start works there:
`pgdrain --version`, `pgdrain migrate`, and a drain of one job from a jobs module in the
current directory."""

from __future__ import annotations

import email.parser
import json
import re
import shlex
import subprocess
import tomllib
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from helpers.wheel import (
    ROOT,
    Installed,
    copy_of_the_sources,
    fresh_virtualenv,
    outside_the_repository,
    run_checked,
    user_environment,
)

pytestmark = pytest.mark.packaging

SOURCES = ROOT / "handler" / "pgdrain"
SCAFFOLD = SOURCES / "scaffold"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_wheel_holds_the_library_and_nothing_else(pgdrain_wheel: Path) -> None:
    with zipfile.ZipFile(pgdrain_wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"pgdrain-{VERSION}.dist-info"
        metadata = email.parser.Parser().parsestr(
            archive.read(f"{dist_info}/METADATA").decode("utf-8")
        )
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode("utf-8")
    library = {n for n in names if not n.startswith(f"{dist_info}/")}
    # Every module and SQL file of the package, every file of the scaffold, and nothing more:
    # no tests, no example jobs (handler/jobs.py), no Lambda entry point but the scaffold's.
    expected = {
        "pgdrain/" + path.relative_to(SOURCES).as_posix()
        for path in SOURCES.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (path.suffix in (".py", ".sql", ".typed") or path.is_relative_to(SCAFFOLD))
    }
    assert library == expected
    assert {
        "pgdrain/db/sql/hot_path.sql",
        "pgdrain/db/sql/control_plane.sql",
        "pgdrain/db/sql/operator_commands.sql",
        "pgdrain/db/sql/worker_role.sql",
        "pgdrain/py.typed",
    } <= library
    assert any(n.startswith("pgdrain/db/sql/migrations/0001_") for n in library)
    assert {
        "pgdrain/scaffold/template.yaml",
        "pgdrain/scaffold/handler/app.py",
        "pgdrain/scaffold/handler/requirements.txt",
        "pgdrain/scaffold/infra/events/schedule.json",
    } <= library

    assert metadata["Version"] == VERSION
    requires = metadata.get_all("Requires-Dist") or []
    yaml = [r for r in requires if r.lower().startswith("pyyaml")]
    assert yaml and all('extra == "invoke"' in r for r in yaml), requires
    core = {re.split(r"[\[<>=; ]", r)[0].lower() for r in requires if "extra ==" not in r}
    assert core == {"psycopg", "aws-lambda-powertools"}
    assert {"aws", "embedded", "invoke", "tracer"} <= set(metadata.get_all("Provides-Extra") or [])
    classifiers = metadata.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert "pgdrain = pgdrain.cli:main" in entry_points


@dataclass(frozen=True)
class QuickStart:
    install: list[str]  # the install line: pip install ...
    jobs_module: str  # the content of jobs.py
    commands: list[list[str]]


def readme_quick_start() -> QuickStart:
    """The README's quick start: its install line, its jobs.py and the commands run after it
    (the export line is what this test does itself)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)
    (install,) = [
        shlex.split(line, comments=True)
        for lang, body in blocks
        if lang == "sh"
        for line in body.splitlines()
        if line.startswith("pip install")
    ]
    (jobs_index,) = [i for i, (lang, body) in enumerate(blocks) if lang == "python"]
    jobs_module = blocks[jobs_index][1]
    assert jobs_module.startswith("# jobs.py")
    lang, body = blocks[jobs_index + 1]
    assert lang == "sh"
    commands = [shlex.split(line, comments=True) for line in body.splitlines()]
    return QuickStart(install, jobs_module, [c for c in commands if c])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh virtualenv, and pgdrain installed into it by the README's install line, run as
    written from the folder that holds the clone (here, a copy of what pip builds from, in the
    folder the line names). No extras: the line asks for none."""
    home = outside_the_repository(tmp_path_factory.mktemp("user"))
    install = readme_quick_start().install
    assert install[:2] == ["pip", "install"] and len(install) == 3, install
    clone = home / install[2]
    assert clone.parent == home, f"{install[2]}: the README installs from a clone beside it"
    copy_of_the_sources(clone)
    bin_dir = fresh_virtualenv(home)
    run_checked([bin_dir / "pip", *install[1:]], cwd=home, env=user_environment())
    workdir = home / "project"
    workdir.mkdir()
    return Installed(bin_dir, workdir)


def test_the_readme_installs_from_a_clone_of_the_repository(installed: Installed) -> None:
    """The line installs this repository's pgdrain, not a package of that name from an
    index: pip records the folder it was built from."""
    site = next((installed.bin.parent / "lib").glob("python3.*/site-packages"))
    (direct_url,) = site.glob("pgdrain-*.dist-info/direct_url.json")
    origin = json.loads(direct_url.read_text())
    assert "dir_info" in origin and origin["url"].endswith("/pgdrain"), origin


def test_the_readme_quick_start_works_where_the_readme_installed_it(
    installed: Installed, empty_db_url: str
) -> None:
    env = installed.environment(empty_db_url)
    version = installed.run("--version", env=env)
    assert (version.code, version.out) == (0, f"pgdrain {VERSION}\n")

    quick = readme_quick_start()
    (installed.workdir / "jobs.py").write_text(quick.jobs_module)
    outputs = []
    for command in quick.commands:
        assert command[0] == "pgdrain", command
        done = installed.run(*command[1:], env=env)
        assert done.code == 0, f"{command}: {done.err}"
        outputs.append(done.out)
    assert outputs[0].startswith("applied: 0001_")  # pgdrain migrate, on an empty database
    assert "hello, world\n" in outputs[-1]  # the job ran, in the drain's process
    assert "done 1," in outputs[-1]
    with psycopg.connect(empty_db_url) as conn:
        rows = conn.execute("SELECT kind, status, attempts FROM pgdrain.jobs").fetchall()
    assert rows == [("hello", "done", 1)]


def test_the_jobs_module_is_found_in_the_current_directory_only(
    installed: Installed, empty_db_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The console script finds jobs.py because the command puts the current directory on the
    path (a console script alone would not); from another directory it is not found, which is
    bad input: one line, exit code 2."""
    env = installed.environment(empty_db_url)
    (installed.workdir / "jobs.py").write_text(readme_quick_start().jobs_module)
    assert installed.run("migrate", env=env).code == 0
    found = installed.run("drain", "--budget", "10", env=env)
    assert found.code == 0, found.err

    elsewhere = outside_the_repository(tmp_path_factory.mktemp("elsewhere"))
    missing = installed.run("drain", "--budget", "10", env=env, cwd=elsewhere)
    assert missing.code == 2
    assert missing.err.splitlines() == [
        "pgdrain: error: PGDRAIN_JOBS: module 'jobs' was not found on the Python path "
        "(which holds the current directory when run by the pgdrain command)"
    ]


def test_invoke_without_its_extra_says_how_to_install_it(
    installed: Installed, empty_db_url: str
) -> None:
    env = installed.environment(empty_db_url)
    done = installed.run("invoke", env=env)
    assert done.code == 2
    assert done.err.splitlines() == [
        "pgdrain: error: `pgdrain invoke` reads template.yaml with PyYAML, which is not "
        "installed: pip install PyYAML (pgdrain's [invoke] extra)"
    ]
    assert done.out == ""


def test_the_demo_runs_outside_a_project_with_its_own_jobs(
    installed: Installed, empty_db_url: str
) -> None:
    """No template.yaml to invoke and no PGDRAIN_JOBS: the demo drains its own kinds (the
    repository's example jobs module is not in the package)."""
    env = installed.environment(empty_db_url)
    done = installed.run("demo", "--count", "20", env=env)
    assert done.code == 0, done.err
    lines = done.out.splitlines()
    assert lines[0].startswith("applied: 0001_")
    drain = "PGDRAIN_JOBS=pgdrain.cli.demo_kinds pgdrain drain --queues demo"
    assert f"drain: {drain} --budget 60" in lines
    assert any(
        line.startswith("drain: claimed 21, done 20, retried 0, failed 1,") for line in lines
    )
    with psycopg.connect(empty_db_url) as conn:
        greeted = conn.execute("SELECT count(*) FROM public.pgdrain_demo_greetings").fetchone()
    assert greeted == (2,)  # the greet jobs ran: jobs 0 and 10 of 20
    # Each command it prints runs as printed, in the user's shell (a red team's report: the
    # drain it printed found no jobs module).
    printed = [line.strip().split("    # ")[0] for line in lines if line.startswith("  ")]
    assert len(printed) == 6 and f"{drain} --budget 30" in printed, done.out
    for command in printed:
        shell = subprocess.run(
            command,
            shell=True,
            cwd=installed.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert shell.returncode == 0, (command, shell.stderr)


@pytest.fixture(autouse=True)
def _no_jobs_module_left(installed: Installed) -> Iterator[None]:
    yield
    (installed.workdir / "jobs.py").unlink(missing_ok=True)
