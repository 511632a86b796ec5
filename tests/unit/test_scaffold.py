"""The project `pgdrain init` writes and this repository deploy the same function: the
scaffold's template.yaml, Lambda entry point, sample events and env.json are the repository's
own files, byte for byte (so `make sam`, the template's tests and the docs cover what users
deploy), and the scaffold's requirements pin this version of pgdrain and the versions of its
dependencies that the function's lock holds (what the tests ran)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import tomllib
from pathlib import Path

import pytest

from pgdrain.cli import init

ROOT = Path(__file__).resolve().parents[2]
SCAFFOLD = ROOT / "handler" / "pgdrain" / "scaffold"
# The scaffold's file, and the repository's that it must equal.
SHARED = {
    "template.yaml": "template.yaml",
    "handler/app.py": "handler/app.py",
    "infra/env.json": "infra/env.json",
    **{
        f"infra/events/{p.name}": f"infra/events/{p.name}"
        for p in (ROOT / "infra/events").iterdir()
    },
}
# The scaffold's own: what differs from the repository's on purpose.
OWN = {"README.md", "handler/jobs.py", "handler/requirements.txt"}
PIN = re.compile(r"^([A-Za-z0-9_.\[\]-]+)==([^\s\\]+)", re.MULTILINE)


def _pins(text: str) -> dict[str, str]:
    return {name.lower(): version for name, version in PIN.findall(text)}


@pytest.mark.parametrize("path", sorted(SHARED))
def test_the_scaffold_holds_the_repositorys_own_file(path: str) -> None:
    assert (SCAFFOLD / path).read_bytes() == (ROOT / SHARED[path]).read_bytes(), (
        f"handler/pgdrain/scaffold/{path} and {SHARED[path]} differ: edit {SHARED[path]}, then "
        f"cp {SHARED[path]} handler/pgdrain/scaffold/{path}"
    )


def test_init_writes_every_scaffold_file_and_the_shared_ones_are_all_checked() -> None:
    written = {f.path for f in init.scaffold_files()}
    on_disk = {
        p.relative_to(SCAFFOLD).as_posix()
        for p in SCAFFOLD.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    assert written == on_disk == set(SHARED) | OWN


def test_the_scaffolds_requirements_pin_this_pgdrain_and_the_locked_dependencies() -> None:
    scaffold = _pins((SCAFFOLD / "handler" / "requirements.txt").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert scaffold.pop("pgdrain") == version
    lock = _pins((ROOT / "handler" / "requirements.txt").read_text())
    assert scaffold == lock, (
        "copy the lock's versions (handler/requirements.txt) into the scaffold's"
    )


def test_the_tracer_line_the_scaffold_offers_is_pgdrains_extra() -> None:
    text = (SCAFFOLD / "handler" / "requirements.txt").read_text()
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"pgdrain[tracer]=={version['version']}" in text
    assert "tracer" in version["optional-dependencies"]


class _Installed:
    """importlib.metadata's distribution, as pip leaves it after installing a wheel file."""

    def __init__(self, wheel: Path, sha256: str) -> None:
        self.record = json.dumps(
            {"url": wheel.as_uri(), "archive_info": {"hashes": {"sha256": sha256}}}
        )

    def read_text(self, name: str) -> str:
        assert name == "direct_url.json"
        return self.record


@pytest.mark.parametrize("rebuilt", [False, True], ids=["as-installed", "rebuilt-since"])
def test_init_copies_the_wheel_only_as_pip_installed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rebuilt: bool
) -> None:
    """A red team's report: a wheel rebuilt under the same name (a git pull, the version
    unchanged) was copied, and the function would deploy code other than what ran here."""
    wheel = tmp_path / "pgdrain-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"as installed")
    installed = _Installed(wheel, hashlib.sha256(b"as installed").hexdigest())
    monkeypatch.setattr(importlib.metadata, "distribution", lambda name: installed)
    if rebuilt:
        wheel.write_bytes(b"rebuilt since")
    files, hint = init.plan(tmp_path / "drain")
    copied = [f.path for f in files if f.path.startswith("wheels/")]
    if rebuilt:
        assert copied == [] and "has changed since" in hint
    else:
        assert copied == [f"wheels/{wheel.name}"] and hint == ""
