"""The simulator's tests (marker `sim`): `pytest -m sim tests/sim`."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "sim: runs the control-plane simulator's smoke form (about 1.5 minutes)"
    )
