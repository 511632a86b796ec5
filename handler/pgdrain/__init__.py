"""pgdrain: a serverless batch drain runner for PostgreSQL job queues."""

from typing import TYPE_CHECKING, Any

from pgdrain import _moved, outcomes
from pgdrain.api.enqueue import (
    Workflow,
    build_job,
    enqueue,
    enqueue_many,
    enqueue_statement,
    workflow,
)
from pgdrain.api.outcomes import Cancel, Discard, JobOutcome, RetryIn, Snooze
from pgdrain.api.periodic import next_periodic_slot
from pgdrain.api.queues import pause_queue, resume_queue
from pgdrain.api.registry import Job, Registry
from pgdrain.api.retry import RetryPolicy
from pgdrain.api.state import job_state
from pgdrain.budget import Budget
from pgdrain.errors import BadInput, ConfigError, DatabaseUnavailable, PgdrainError
from pgdrain.runner.drain import DrainResult, drain
from pgdrain.settings import Settings

_moved.install()

if TYPE_CHECKING:
    from pgdrain.aws.kick import kick

__all__ = [
    "BadInput",
    "Budget",
    "Cancel",
    "ConfigError",
    "DatabaseUnavailable",
    "Discard",
    "DrainResult",
    "Job",
    "JobOutcome",
    "PgdrainError",
    "Registry",
    "RetryIn",
    "RetryPolicy",
    "Settings",
    "Snooze",
    "Workflow",
    "build_job",
    "drain",
    "enqueue",
    "enqueue_many",
    "enqueue_statement",
    "job_state",
    "kick",
    "next_periodic_slot",
    "outcomes",
    "pause_queue",
    "resume_queue",
    "workflow",
]


def __getattr__(name: str) -> Any:
    # pgdrain.kick lives at the edge (pgdrain.aws, and boto3 once a kick is sent): loaded on
    # first use, so importing the core loads nothing of AWS.
    if name == "kick":
        from pgdrain.aws.kick import kick

        return kick
    raise AttributeError(f"module 'pgdrain' has no attribute {name!r}")
