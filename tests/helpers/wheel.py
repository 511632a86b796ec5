"""pgdrain as a user installs it: the wheel, built once per test session from a copy of what
pyproject.toml packages, and fresh virtualenvs outside the repository to install it into; the
`pgdrain` command run from there, in a user's environment (nothing of this repository's on the
path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PIP_TIMEOUT_SECONDS = 600.0
COMMAND_TIMEOUT_SECONDS = 120.0
# What building the wheel copies: the files pyproject.toml packages, and nothing else.
PACKAGED = ("pyproject.toml", "README.md", "LICENSE")


def outside_the_repository(path: Path) -> Path:
    assert not path.resolve().is_relative_to(ROOT), f"{path} is inside the repository"
    return path


def run_checked(args: Sequence[str | Path], cwd: Path, env: Mapping[str, str] | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=PIP_TIMEOUT_SECONDS,
        check=False,
    )
    assert done.returncode == 0, f"{args} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def copy_of_the_sources(into: Path) -> Path:
    """What a clone holds for pip to build pgdrain from, copied into `into` (so that building
    writes nothing into the working tree: build/ and *.egg-info land in the copy)."""
    into.mkdir(parents=True, exist_ok=True)
    for name in PACKAGED:
        shutil.copy2(ROOT / name, into / name)
    shutil.copytree(
        ROOT / "handler",
        into / "handler",
        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
    )
    return into


@pytest.fixture(scope="session")
def pgdrain_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built once for the session."""
    source = copy_of_the_sources(outside_the_repository(tmp_path_factory.mktemp("source")))
    out = tmp_path_factory.mktemp("dist")
    run_checked(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(out), "."],
        cwd=source,
        env=user_environment(),
    )
    (built,) = out.glob("pgdrain-*.whl")
    return built


@dataclass(frozen=True)
class Finished:
    code: int
    out: str
    err: str


@dataclass(frozen=True)
class Installed:
    """A virtualenv holding pgdrain, and a folder outside the repository to run it from."""

    bin: Path
    workdir: Path

    def run(
        self, *args: str, env: Mapping[str, str], cwd: Path | None = None, program: str = "pgdrain"
    ) -> Finished:
        done = subprocess.run(
            [str(self.bin / program), *args],
            cwd=cwd or self.workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_SECONDS,
            check=False,
        )
        return Finished(done.returncode, done.stdout, done.stderr)

    def environment(self, database_url: str | None = None, **extra: str) -> dict[str, str]:
        """A shell with the virtualenv active: its bin first on PATH."""
        env = user_environment(database_url)
        env["PATH"] = f"{self.bin}{os.pathsep}{env.get('PATH', '')}"
        env.update(extra)
        return env


def fresh_virtualenv(home: Path) -> Path:
    """A new virtualenv in home/venv (its pip may use pip's cache); returns its bin folder."""
    venv.create(outside_the_repository(home) / "venv", with_pip=True)
    return home / "venv" / "bin"


def install_wheel(wheel: Path, home: Path, extras: str = "") -> Installed:
    """`pip install WHEEL[extras]` into a fresh virtualenv, from `home`."""
    bin_dir = fresh_virtualenv(home)
    target = f"{wheel}[{extras}]" if extras else str(wheel)
    run_checked(
        [bin_dir / "python", "-m", "pip", "install", "--quiet", target],
        cwd=home,
        env=user_environment(),
    )
    workdir = home / "project"
    workdir.mkdir()
    return Installed(bin_dir, workdir)


def user_environment(database_url: str | None = None) -> dict[str, str]:
    """This process's environment less anything that would put this repository's code on the
    path or set pgdrain's settings (PYTHON*, VIRTUAL_ENV, PGDRAIN_*, POWERTOOLS_*)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PGDRAIN_", "PYTHON", "VIRTUAL_ENV", "POWERTOOLS_"))
    }
    if database_url is not None:
        env["DATABASE_URL"] = database_url
    return env
