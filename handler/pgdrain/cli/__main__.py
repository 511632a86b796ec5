"""`python -m pgdrain.cli`: the `pgdrain` command."""

import sys

from pgdrain.cli.commands import main

sys.exit(main())
