"""`pgdrain` without the end of a forked child that returns from its job: the control of
test_a_forked_child_that_returns_ends_and_runs_nothing."""

import sys

from pgdrain.cli.commands import main
from pgdrain.runner import worker_threads

worker_threads.in_a_forked_child = lambda pid: False

sys.exit(main())
