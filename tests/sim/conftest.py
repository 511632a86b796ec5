"""The simulator's tests (marker `sim`): `pytest -m sim tests/sim`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

# The simulator is the top-level package sim/, beside handler/ (pyproject's pythonpath names
# handler and tests only, and `pytest` run as a script does not put the root on the path).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim: runs the control-plane simulator's smoke form (about 1.5 minutes)"
    )
