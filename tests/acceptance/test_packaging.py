"""The package as a user gets it: the wheel holds the library and nothing else, and once
installed (without extras) into a fresh virtualenv outside the repository, the README's quick
start works there: `pgdrain --version`, `pgdrain migrate`, and a drain of one job from a jobs
module in the current directory."""

from __future__ import annotations

import email.parser
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.packaging

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "handler" / "pgdrain"
PIP_TIMEOUT_SECONDS = 600.0
COMMAND_TIMEOUT_SECONDS = 120.0
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def _outside_the_repository(path: Path) -> Path:
    assert not path.resolve().is_relative_to(ROOT), f"{path} is inside the repository"
    return path


def _run(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        args,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of what pyproject.toml packages (so that building writes
    nothing into the working tree: build/ and *.egg-info land in the copy)."""
    source = _outside_the_repository(tmp_path_factory.mktemp("source"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "handler",
        source / "handler",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    out = tmp_path_factory.mktemp("dist")
    _run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), "."],
        cwd=source,
    )
    (built,) = out.glob("pgdrain-*.whl")
    return built


def test_the_wheel_holds_the_library_and_nothing_else(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        dist_info = f"pgdrain-{VERSION}.dist-info"
        metadata = email.parser.Parser().parsestr(
            archive.read(f"{dist_info}/METADATA").decode("utf-8")
        )
        entry_points = archive.read(f"{dist_info}/entry_points.txt").decode("utf-8")
    library = {n for n in names if not n.startswith(f"{dist_info}/")}
    # Every module and SQL file of the package, and nothing more: no tests, no example jobs
    # (handler/jobs.py), no Lambda entry point (handler/app.py).
    expected = {
        "pgdrain/" + path.relative_to(SOURCES).as_posix()
        for path in SOURCES.rglob("*")
        if path.is_file() and path.suffix in (".py", ".sql", ".typed")
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

    assert metadata["Version"] == VERSION
    requires = metadata.get_all("Requires-Dist") or []
    yaml = [r for r in requires if r.lower().startswith("pyyaml")]
    assert yaml and all('extra == "invoke"' in r for r in yaml), requires
    core = {re.split(r"[\[<>=; ]", r)[0].lower() for r in requires if "extra ==" not in r}
    assert core == {"psycopg", "aws-lambda-powertools"}
    assert {"aws", "embedded", "invoke"} <= set(metadata.get_all("Provides-Extra") or [])
    classifiers = metadata.get_all("Classifier") or []
    assert "Programming Language :: Python :: 3.11" in classifiers
    assert "Typing :: Typed" in classifiers
    assert "pgdrain = pgdrain.cli:main" in entry_points


@dataclass(frozen=True)
class Installed:
    bin: Path
    workdir: Path  # where the user runs pgdrain: outside the repository

    def run(self, *args: str, env: dict[str, str], cwd: Path | None = None) -> Finished:
        done = subprocess.run(
            [str(self.bin / "pgdrain"), *args],
            cwd=cwd or self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
        return Finished(done.returncode, done.stdout, done.stderr)


@dataclass(frozen=True)
class Finished:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Installed:
    """A fresh virtualenv with the wheel installed, no extras (pip may use its cache)."""
    home = _outside_the_repository(tmp_path_factory.mktemp("user"))
    venv.create(home / "venv", with_pip=True)
    bin_dir = home / "venv" / "bin"
    _run([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel)], cwd=home)
    workdir = home / "project"
    workdir.mkdir()
    return Installed(bin_dir, workdir)


def _user_environment(installed: Installed, database_url: str) -> dict[str, str]:
    """A shell in the virtualenv: nothing of this repository's on the path, no pgdrain
    settings but the database."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGDRAIN_", "PYTHON", "VIRTUAL_ENV", "POWERTOOLS_"))
    }
    env["PATH"] = f"{installed.bin}{os.pathsep}{env.get('PATH', '')}"
    env["DATABASE_URL"] = database_url
    return env


@dataclass(frozen=True)
class QuickStart:
    jobs_module: str  # the content of jobs.py
    commands: list[list[str]]


def readme_quick_start() -> QuickStart:
    """The README's quick start: its jobs.py and the commands run after it (the install and
    export lines are what this test does itself)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("\n## Quick start\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```(\w+)\n(.*?)```", section, flags=re.DOTALL)
    (jobs_index,) = [i for i, (lang, body) in enumerate(blocks) if lang == "python"]
    jobs_module = blocks[jobs_index][1]
    assert jobs_module.startswith("# jobs.py")
    lang, body = blocks[jobs_index + 1]
    assert lang == "sh"
    commands = [shlex.split(line, comments=True) for line in body.splitlines()]
    return QuickStart(jobs_module, [c for c in commands if c])


def test_the_readme_quick_start_works_from_the_installed_wheel(
    installed: Installed, empty_db_url: str
) -> None:
    env = _user_environment(installed, empty_db_url)
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
    env = _user_environment(installed, empty_db_url)
    (installed.workdir / "jobs.py").write_text(readme_quick_start().jobs_module)
    assert installed.run("migrate", env=env).code == 0
    found = installed.run("drain", "--budget", "10", env=env)
    assert found.code == 0, found.err

    elsewhere = _outside_the_repository(tmp_path_factory.mktemp("elsewhere"))
    missing = installed.run("drain", "--budget", "10", env=env, cwd=elsewhere)
    assert missing.code == 2
    assert missing.err.splitlines() == [
        "pgdrain: error: PGDRAIN_JOBS: module 'jobs' was not found on the Python path "
        "(which holds the current directory when run by the pgdrain command)"
    ]


def test_invoke_without_its_extra_says_how_to_install_it(
    installed: Installed, empty_db_url: str
) -> None:
    env = _user_environment(installed, empty_db_url)
    done = installed.run("invoke", env=env)
    assert done.code == 2
    assert done.err.splitlines() == [
        "pgdrain: error: `pgdrain invoke` reads template.yaml with PyYAML, which is not "
        "installed: pip install 'pgdrain[invoke]'"
    ]
    assert done.out == ""


@pytest.fixture(autouse=True)
def _no_jobs_module_left(installed: Installed) -> Iterator[None]:
    yield
    (installed.workdir / "jobs.py").unlink(missing_ok=True)
