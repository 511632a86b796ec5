"""The always-on baseline (`python -m sim.poller`): a worker process that keeps a connection open
(as PgQueuer's and Procrastinate's workers hold one for LISTEN) and calls pgdrain's own drain
every simulated second. The same drain, the same job code: only the control plane differs."""

from __future__ import annotations

import os
import time

import psycopg

from pgdrain.api.registry import load_registry
from pgdrain.budget import Budget
from pgdrain.db.connection import APPLICATION_NAME
from pgdrain.runner.drain import drain
from pgdrain.settings import Settings
from sim.jobs import SCALE_VARIABLE

POLL_INTERVAL_S = 1.0  # simulated
# Simulated: each poll drains until nothing is ready, for at most a Lambda run's longest. An
# always-on worker has no deadline; with one of a minute (5 real seconds at the smoke's scale),
# a poll that reached it on a loaded host ended the leases of the jobs still running, and the
# next poll ran them again while the first attempts finished (10 double completions, once).
DRAIN_BUDGET_S = 900.0


def main() -> None:
    factor = float(os.environ[SCALE_VARIABLE])
    settings = Settings.from_env(os.environ)
    registry = load_registry(settings.jobs_module)
    url = os.environ["DATABASE_URL"]
    # The listener connection: open for the worker's whole life, as a LISTEN connection is.
    with psycopg.connect(url, autocommit=True, application_name=APPLICATION_NAME):
        next_poll = time.time()
        while True:
            drain(
                settings,
                Budget.seconds(DRAIN_BUDGET_S / factor),
                registry,
                url,
                queues=settings.queues,
                worker_id="poller",
            )
            next_poll += POLL_INTERVAL_S / factor
            time.sleep(max(0.0, next_poll - time.time()))


if __name__ == "__main__":
    main()
