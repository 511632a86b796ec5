"""`pgdrain init [DIR]`: a deployable project in the user's repository, copied from the
package's scaffold/ folder: template.yaml (the same file as pgdrain's own repository deploys),
handler/ (the function's code: the Lambda entry, a jobs module, requirements.txt), infra/ (the
sample events and env.json for `sam local invoke`) and a README; and wheels/, holding the
wheel pgdrain was installed from, where handler/requirements.txt finds it while pgdrain is not
on PyPI.

A file that exists is never overwritten without --force: they are all named, exit 2, and
nothing is written."""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import json
import os
import shlex
import shutil
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

from pgdrain.cli.report import printable
from pgdrain.errors import BadInput, PgdrainError

SCAFFOLD = "scaffold"
WHEELS = "wheels"
SKIPPED = ("__pycache__",)


@dataclass(frozen=True)
class ProjectFile:
    path: str  # relative to the project's folder, with "/"
    source: Traversable | Path


@dataclass(frozen=True)
class Written:
    folder: Path
    files: tuple[str, ...]
    wheel: str | None  # the wheel copied into wheels/, or None
    wheel_hint: str  # without one: how to put one there


def scaffold_files() -> list[ProjectFile]:
    """Every file of the scaffold, by its path in the project."""
    return sorted(_walk(importlib.resources.files("pgdrain") / SCAFFOLD, ""), key=_order)


def _walk(folder: Traversable, prefix: str) -> Iterator[ProjectFile]:
    for entry in folder.iterdir():
        if entry.name in SKIPPED or entry.name.endswith(".pyc"):
            continue
        path = f"{prefix}{entry.name}"
        if entry.is_dir():
            yield from _walk(entry, f"{path}/")
        else:
            yield ProjectFile(path, entry)


def _order(file: ProjectFile) -> tuple[int, str]:
    """The project's top-level files first, then each folder's."""
    return (file.path.count("/") > 0, file.path)


def installed_from() -> tuple[Path | None, str | None]:
    """Where pip installed pgdrain from (its direct_url.json): a wheel file that is still there,
    or else a source folder; (None, None) for an index or an unknown origin."""
    try:
        record = importlib.metadata.distribution("pgdrain").read_text("direct_url.json")
    except importlib.metadata.PackageNotFoundError:
        return None, None
    try:
        origin = json.loads(record or "{}")
    except json.JSONDecodeError:
        return None, None
    url = origin.get("url") if isinstance(origin, dict) else None
    if not isinstance(url, str) or not url.startswith("file:"):
        return None, None
    path = Path(urllib.request.url2pathname(urllib.parse.urlparse(url).path))
    archive = origin.get("archive_info")
    if isinstance(archive, dict) and path.suffix == ".whl" and path.is_file():
        if not _same_as_installed(path, archive):
            raise ChangedWheel(path)
        return path, None
    return None, str(path) if "dir_info" in origin else None


class ChangedWheel(Exception):
    """The wheel file pgdrain was installed from holds other contents now (rebuilt since, under
    the same name): copied, it would deploy code other than what runs here."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self.path = path


def _same_as_installed(path: Path, archive: dict[str, object]) -> bool:
    """Whether the wheel's sha256 is the one pip recorded when it installed it (True when pip
    recorded none)."""
    hashes = archive.get("hashes")
    recorded = hashes.get("sha256") if isinstance(hashes, dict) else None
    legacy = archive.get("hash")
    if recorded is None and isinstance(legacy, str) and legacy.startswith("sha256="):
        recorded = legacy.removeprefix("sha256=")
    if not isinstance(recorded, str):
        return True
    return hashlib.sha256(path.read_bytes()).hexdigest() == recorded


def plan(folder: Path) -> tuple[list[ProjectFile], str]:
    """The files to write (the wheel included, when there is one) and, without a wheel, the
    line saying how to put one in wheels/."""
    files = scaffold_files()
    try:
        wheel, source_folder = installed_from()
    except ChangedWheel as changed:
        hint = (
            f"{WHEELS}/: pgdrain was installed from {changed.path}, which has changed since (its "
            "sha256 is not the one pip recorded), so none was copied: install pgdrain from the "
            f"wheel you mean to deploy, or put that wheel in {folder / WHEELS}"
        )
        return files, hint
    if wheel is not None:
        return [*files, ProjectFile(f"{WHEELS}/{wheel.name}", wheel)], ""
    clone = source_folder or "<a clone of pgdrain's repository>"
    hint = (
        f"{WHEELS}/: pgdrain was not installed from a wheel file, so none was copied; until "
        f"pgdrain is on PyPI, `sam build` needs one there: pip wheel --no-deps -w "
        f"{folder / WHEELS} {clone}"
    )
    return files, hint


def existing(folder: Path, files: list[ProjectFile]) -> list[str]:
    """The files of the project that are already there."""
    return [f.path for f in files if (folder / f.path).exists() or (folder / f.path).is_symlink()]


def _check_folders(folder: Path, files: list[ProjectFile]) -> None:
    """A folder of the project that is a file is bad input, with or without --force."""
    if folder.exists() and not folder.is_dir():
        raise BadInput(f"{folder} is not a directory")
    folders = sorted({p for f in files for p in Path(f.path).parents if p != Path(".")})
    for relative in folders:
        path = folder / relative
        if path.exists() and not path.is_dir():
            raise BadInput(f"{path} is a file, where the project has a folder: nothing was written")


def write(folder: Path, *, force: bool) -> Written:
    files, hint = plan(folder)
    _check_folders(folder, files)
    taken = existing(folder, files)
    if taken and not force:
        raise BadInput(
            f"{folder} already has {', '.join(taken)}: nothing was written "
            "(--force overwrites these files)"
        )
    for file in files:
        target = folder / file.path
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _replace(target, file.source)
        except OSError as exc:
            raise PgdrainError(f"cannot write {target}: {exc.strerror or exc}") from None
    wheel = next((f.path for f in files if f.path.startswith(f"{WHEELS}/")), None)
    return Written(folder, tuple(f.path for f in files), wheel, hint)


def _replace(target: Path, source: Traversable | Path) -> None:
    """Write through a temporary file, then rename: a file is either the old or the new one.
    Running init again with --force writes the same bytes: safe to repeat."""
    partial = target.with_name(f".{target.name}.pgdrain-init")
    with source.open("rb") as reader, open(partial, "wb") as writer:
        shutil.copyfileobj(reader, writer)
    os.replace(partial, target)


def _has_yaml() -> bool:
    """Is PyYAML, which `pgdrain invoke` needs (the [invoke] extra), importable here?"""
    try:
        import yaml  # noqa: F401
    except ImportError:
        return False
    return True


def report(written: Written) -> str:
    """What was written, and the commands to run next (from the project's folder)."""
    folder = written.folder
    lines = [f"wrote {printable(folder)}: {', '.join(written.files)}"]
    if written.wheel is None:
        lines.append(printable(written.wheel_hint))
    lines.append(f"next ({printable(folder / 'README.md')} says more):")
    # A folder named "-x" would be an option of cd: "./-x" is the same folder.
    shown = str(folder) if not str(folder).startswith("-") else f"./{folder}"
    steps = [] if folder == Path(".") else [f"cd {printable(shlex.quote(shown))}"]
    steps += [
        "export DATABASE_URL=...    # a development database: invoke runs its ready jobs",
        "                           # (a server without TLS: end the URL with ?sslmode=disable)",
        "export PYTHONPATH=handler    # where the pgdrain command finds handler/jobs.py",
        "pgdrain migrate",
        'pgdrain enqueue hello --payload \'{"name": "world"}\'',
    ]
    if not _has_yaml():
        # PyYAML itself, not `pgdrain[invoke]`: pgdrain is not on PyPI, where pip would look.
        steps.append("pip install PyYAML    # invoke reads template.yaml (the [invoke] extra)")
    steps += [
        "pgdrain invoke -e infra/events/enqueue.json    # the function, run here as on Lambda",
        "sam validate --lint && sam build",
    ]
    lines += [f"  {step}" for step in steps]
    return "\n".join(lines)
