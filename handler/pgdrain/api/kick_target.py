"""Where pgdrain.kick() sends a kick: to the drain function on Lambda, or to `pgdrain worker`
by NOTIFY; and how a kick that nobody hears is told apart from one that a worker hears.

PGDRAIN_KICK says where (Settings.kick):
- `lambda`: invoke PGDRAIN_FUNCTION_NAME (pgdrain.aws.kick).
- `worker`: NOTIFY pgdrain_kick on the application's connection; every `pgdrain worker`
  connected to the database wakes and drains. A worker on a laptop, or in a container.
- `off`: no kick. The drain function's own setting: a run drains what its jobs enqueue.
- `auto` (unset): `lambda` when PGDRAIN_FUNCTION_NAME is set. Without it: on AWS compute
  (AWS_LAMBDA_FUNCTION_NAME or AWS_EXECUTION_ENV set: Lambda, ECS, Fargate) a ConfigError,
  since the application is deployed without the function's name and its jobs would wait for
  the safety net; elsewhere `worker` (development: `pgdrain worker` in a terminal).

A worker kick says whether it was heard: the statement that sends it also looks for a worker
connected to the database (its listening connection's application_name, which
pg_stat_activity shows to every role). When none is, kick() logs a warning once per process.
Nothing is lost then: a worker drains everything ready when it starts."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from typing import Literal

from pgdrain.db import store
from pgdrain.errors import ConfigError
from pgdrain.settings import Settings

log = logging.getLogger(__name__)

CHANNEL = "pgdrain_kick"  # as written in sql/worker.sql
# The application_name of a worker's listening connection: how a kick sees that it is heard.
LISTENER_APPLICATION_NAME = "pgdrain worker"
# Set on AWS compute: an application there without PGDRAIN_FUNCTION_NAME is misconfigured.
AWS_VARIABLES = ("AWS_LAMBDA_FUNCTION_NAME", "AWS_EXECUTION_ENV")
MAX_PAYLOAD_BYTES = 7999  # PostgreSQL refuses a NOTIFY payload of 8000 bytes or more

KickTarget = Literal["lambda", "worker", "off"]

_warned = threading.Event()


def kick_target(settings: Settings, env: Mapping[str, str]) -> KickTarget:
    """Where a kick goes, from the settings and (for `auto`) the environment."""
    mode = settings.kick
    if mode != "auto":
        return mode
    if settings.function_name:
        return "lambda"
    deployed = [name for name in AWS_VARIABLES if env.get(name)]
    if deployed:
        raise ConfigError(
            f"kick: PGDRAIN_FUNCTION_NAME is not set, and this runs on AWS ({deployed[0]} is "
            "set): set it to the drain function's name (the stack's FunctionName output), or "
            "PGDRAIN_KICK=worker when a `pgdrain worker` drains, or PGDRAIN_KICK=off"
        )
    return "worker"


def notify_payload(queues: Sequence[str]) -> str:
    """The kicked queues, comma-separated; empty (every queue) when too long for a NOTIFY."""
    text = ",".join(queues)
    return text if len(text.encode("utf-8")) <= MAX_PAYLOAD_BYTES else ""


def kicked_queues(payload: str) -> frozenset[str] | None:
    """The queues a NOTIFY's payload names; None for every queue (an empty payload: a plain
    `NOTIFY pgdrain_kick` from any client)."""
    names = frozenset(part.strip() for part in payload.split(",") if part.strip())
    return names or None


def notify_worker(conn: store.Connection, queues: Sequence[str]) -> tuple[str, ...]:
    """NOTIFY the workers of `queues` (on `conn`, with no transaction open: delivered at once).
    Returns the queues when a worker is connected to hear it; () with a warning (once per
    process) when none is."""
    # Its own transaction, committed here: a NOTIFY goes out at commit, and on a connection
    # that is not autocommit (psycopg's default) the statement alone opens one nobody ends.
    with conn.transaction():
        heard = store.kick_notify(conn, notify_payload(queues), LISTENER_APPLICATION_NAME)
    if heard:
        log.debug("kicked the workers", extra={"queues": list(queues)})
        return tuple(queues)
    if not _warned.is_set():
        _warned.set()
        log.warning(
            "kick: no `pgdrain worker` is connected to this database, so nothing drains these "
            "queues now (a worker drains them when it starts); set PGDRAIN_FUNCTION_NAME to "
            "kick the Lambda function instead, or PGDRAIN_KICK=off to send no kicks",
            extra={"queues": list(queues)},
        )
    else:
        log.debug("kick: no worker is connected", extra={"queues": list(queues)})
    return ()
