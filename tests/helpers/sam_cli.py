"""The SAM CLI, for the tests that run it as a user would: PGDRAIN_SAM (a path to `sam`), else
the virtualenv `make sam` installs it into (.venv-sam, which CI creates before the tests), else
`sam` on PATH. `sam build` (without a container) also needs a python3.12, the function's
runtime: on PATH, else pyenv's newest 3.12, as the Makefile finds it."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SAM_VARIABLE = "PGDRAIN_SAM"
RUNTIME_PYTHON = "python3.12"  # template.yaml's Runtime
NOT_INSTALLED = (
    "the SAM CLI is not installed: `make sam` installs it into .venv-sam (or set PGDRAIN_SAM "
    "to a `sam`)"
)
NO_RUNTIME_PYTHON = f"sam build needs a {RUNTIME_PYTHON} (the function's runtime): none found"


def sam_cli() -> Path | None:
    configured = os.environ.get(SAM_VARIABLE)
    if configured:
        return Path(configured)
    for candidate in (ROOT / ".venv-sam" / "bin" / "sam", shutil.which("sam")):
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            return Path(candidate)
    return None


def _runs(python: str, env: Mapping[str, str]) -> bool:
    try:
        done = subprocess.run(
            [python, "-c", "pass"], env=env, capture_output=True, timeout=30, check=False
        )
    except OSError:
        return False
    return done.returncode == 0


def with_runtime_python(env: Mapping[str, str]) -> dict[str, str] | None:
    """`env` with a python3.12 that runs first on PATH, or None when there is none."""
    found = shutil.which(RUNTIME_PYTHON, path=env.get("PATH"))
    if found and _runs(found, env):
        return dict(env)
    pyenv = shutil.which("pyenv", path=env.get("PATH"))
    if pyenv is None:
        return None
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
    versions = Path(root.stdout.strip()) / "versions"
    candidates = sorted(
        versions.glob("3.12.*"),
        key=lambda p: [int(x) for x in p.name.split(".") if x.isdigit()],
        reverse=True,
    )
    for version in candidates:
        python = version / "bin" / RUNTIME_PYTHON
        if python.is_file() and _runs(str(python), env):
            return {**env, "PATH": f"{python.parent}{os.pathsep}{env.get('PATH', '')}"}
    return None
