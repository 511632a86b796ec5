"""`python -m sim`: see sim/__init__.py and sim/run.py."""

import sys

from sim.run import main

sys.exit(main())
