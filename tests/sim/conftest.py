"""The simulator's tests (marker `sim`, registered in pyproject.toml): `pytest -m sim tests/sim`."""

from __future__ import annotations

import sys
from pathlib import Path

# The simulator is the top-level package sim/, beside handler/ (pyproject's pythonpath names
# handler and tests only, and `pytest` run as a script does not put the root on the path).
ROOT = str(Path(__file__).resolve().parents[2])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
