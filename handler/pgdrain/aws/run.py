"""One invocation of the drain function: parse the event, drain, report, continue if needed.

handler/app.py builds the Powertools Logger and Metrics and the cold-start state, and hands each
event to handle(). A timeout is a hard kill with nothing in `finally` run, so counts leave the
process as the run goes (ProgressMetrics flushes every few seconds), not only at the end."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import psycopg
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit

from pgdrain.api import periodic
from pgdrain.api.registry import Registry, load_registry
from pgdrain.aws import events, wake_request
from pgdrain.aws.context import LambdaContextLike, budget_from_context
from pgdrain.aws.control import RunControl
from pgdrain.aws.fanout import Spawner
from pgdrain.aws.kick import kick_hold_seconds
from pgdrain.aws.lambda_api import invoke_async
from pgdrain.aws.metrics import AGE_METRIC, DELETED_METRIC, DEPTH_METRIC, ProgressMetrics
from pgdrain.aws.safety_net import SafetyNet, SlideOutcome
from pgdrain.aws.secrets import resolve_conninfo
from pgdrain.aws.wake import Waker
from pgdrain.budget import Budget
from pgdrain.db import retention, store
from pgdrain.db.session import Session
from pgdrain.errors import BadEvent, BadInput, PgdrainError
from pgdrain.runner.drain import DrainResult, Observer, drain
from pgdrain.runner.summary import error_kind
from pgdrain.settings import Settings, describe_queues

log = logging.getLogger(__name__)

# Measuring the backlog opens one more connection; skip it when the run is about to be killed
# (connection.MIN_CONNECT_TIMEOUT_SECONDS plus a query).
DEPTH_MIN_REMAINING_SECONDS = 2.5
# Ending a run stopped for time (its wake-up, the kick window) needs that connection too, but
# is worth the risk of the timeout down to here: without it, work due later waits for the
# safety net. A local connect and one statement take milliseconds.
EXIT_MIN_REMAINING_SECONDS = 1.0
# The least reserve that leaves a run stopped for time EXIT_MIN_REMAINING_SECONDS after its
# last jobs' final margin (the template's ReserveSeconds MinValue).
MIN_FUNCTION_RESERVE_SECONDS = 2.0
SAM_LOCAL_VARIABLE = "AWS_SAM_LOCAL"  # set by `sam local invoke` and `pgdrain invoke`
# A scheduled run keeps this share of its budget (at most retention.MAX_SECONDS) from the
# drain for retention afterwards, when the database is awake: a queue busy enough to use every
# run's whole budget still has its old jobs deleted.
RETENTION_SHARE = 0.1

# When this execution environment last ran retention (time.monotonic()): a run that stands in
# for the safety net (below) runs it too, at most once per ScheduleRate per environment.
_retention_ran_at: float | None = None
_retention_lock = threading.Lock()


class ColdStart(NamedTuple):
    """What is read once per execution environment: settings and the job registry, or the
    configuration error that every invocation will report."""

    settings: Settings | None = None
    registry: Registry | None = None
    error: str | None = None


def cold_start(env: Mapping[str, str]) -> ColdStart:
    try:
        settings = Settings.from_env(env)
        registry = load_registry(settings.jobs_module)
    except BadInput as exc:
        log.error("configuration error: %s", exc)
        return ColdStart(error=str(exc))
    periodic.warn_of_undrained(registry.periodics, settings.queues)
    if settings.reserve_seconds < MIN_FUNCTION_RESERVE_SECONDS:
        log.warning(
            "PGDRAIN_RESERVE_SECONDS is %g: a run stopped for time then has too little left "
            "to end its state and make its wake-up (work due later waits for the safety net); "
            "keep at least %g",
            settings.reserve_seconds,
            MIN_FUNCTION_RESERVE_SECONDS,
        )
    return ColdStart(settings=settings, registry=registry)


class _Invocation(NamedTuple):
    """What an invocation works with once its configuration and its event are known good."""

    settings: Settings
    registry: Registry
    trigger: events.Trigger
    budget: Budget
    worker_id: str


class _Finished(NamedTuple):
    """A drain and what came after it: the continuation, the backlog left, retention."""

    result: DrainResult
    continued: bool
    depth: store.QueueDepth | None
    deleted: retention.RetentionResult | None
    safety_net: SlideOutcome | None = None


def handle(
    event: object,
    context: LambdaContextLike,
    runtime: ColdStart,
    *,
    logger: Logger,
    metrics: Metrics,
) -> dict[str, Any]:
    """Run the drain an event asks for and return its summary. A bad event or configuration
    returns {"ok": false, "error": ...} after one error line, and touches no database."""
    logger.set_correlation_id(events.correlation_id(event))
    run = _parse(event, context, runtime, logger)
    if not isinstance(run, _Invocation):
        return run  # the configuration or the event is bad: nothing ran
    if run.trigger.reason == events.SCHEDULE:
        skipped = _skip_tick(run, context, logger)
        if skipped is not None:
            return skipped
    if run.trigger.reason == events.LATER:
        with ProgressMetrics(metrics) as progress:
            waker = Waker(run.settings, _target(context), count=progress.count)
            answered = wake_request.answer(run.trigger, waker, run.settings.queues, run.budget)
        if answered is not None:
            return answered
        wake_request.forget(run.trigger, run.settings, run.budget)
    with ProgressMetrics(metrics) as progress:
        drain_budget = _drain_budget(run)
        control = _control(
            run.settings,
            run.trigger,
            run.budget,
            run.worker_id,
            context,
            progress.count,
            run.registry,
        )
        try:
            result, conninfo = _drain(
                run, drain_budget, control.counting(progress.observe), control
            )
        except PgdrainError as exc:  # no database configured, or its secret unreadable
            logger.error("run failed: %s", exc)
            return _failed_before_connecting(run.trigger, exc)
        finally:
            control.close()
        progress.flush()
        finished = _finish(run, result, conninfo, control, context, logger, progress)
    summary = _summary(run.trigger, finished, control, logger)
    if result.abandoned and not finished.continued and result.stop_reason != "stopped":
        # (A run stopped by a signal ended its jobs' leases already: nothing to retry for.)
        # Their leases end at this run's deadline, and nothing else would start a run for them
        # before the hourly schedule. A function error makes Lambda run this event once more
        # about a minute later (template.yaml: MaximumRetryAttempts 1), as it does after a
        # timeout; that run reclaims them. Safe to repeat: every run is.
        raise JobsAbandoned(
            f"{result.abandoned} job(s) still running at the deadline; their leases end now, "
            "and failing this invocation makes Lambda retry it to reclaim them"
        )
    return summary


def _parse(
    event: object, context: LambdaContextLike, runtime: ColdStart, logger: Logger
) -> _Invocation | dict[str, Any]:
    """The invocation an event asks for, or, after one error line, the answer to a bad
    configuration or a bad event."""
    if runtime.settings is None or runtime.registry is None:
        logger.error("configuration error: %s", runtime.error)
        return {"ok": False, "error": runtime.error, "error_kind": "configuration"}
    try:
        trigger = events.parse(event, runtime.settings)
    except BadEvent as exc:
        logger.error("bad event: %s", exc)
        return {"ok": False, "error": str(exc)}
    logger.append_keys(trigger=trigger.reason, chain=trigger.chain)
    if trigger.unserved:
        logger.error(
            "kicked for a queue this function does not drain (PGDRAIN_QUEUES=%s): its jobs "
            "wait for a function that drains it",
            describe_queues(runtime.settings.queues),
            extra={"unserved": list(trigger.unserved)},
        )
    budget = budget_from_context(context)
    if budget.remaining() <= runtime.settings.reserve_seconds:
        # At its start an invocation has the function's whole Timeout: a reserve that takes it
        # all leaves no run anything to claim, and each would continue itself, to no end.
        error = (
            f"PGDRAIN_RESERVE_SECONDS ({runtime.settings.reserve_seconds:g} s) leaves nothing of "
            f"the {budget.remaining():.1f} s this invocation has (the function's Timeout): no "
            "job could be claimed; lower it or raise Timeout"
        )
        logger.error("configuration error: %s", error)
        return {"ok": False, "error": error, "error_kind": "configuration"}
    logger.info(
        "run starting",
        extra={"queues": _queue_list(trigger), "remaining_s": round(budget.remaining(), 1)},
    )
    worker_id = f"{context.function_name}:{context.aws_request_id}"
    return _Invocation(runtime.settings, runtime.registry, trigger, budget, worker_id)


def _drain_budget(run: _Invocation) -> Budget:
    """The invocation's budget, less what a scheduled run keeps for retention afterwards."""
    if not run.trigger.housekeeping:
        return run.budget
    budget = run.budget
    kept = min(retention.MAX_SECONDS, RETENTION_SHARE * budget.remaining())
    return Budget(lambda: budget.remaining() - kept)


def _finish(
    run: _Invocation,
    result: DrainResult,
    conninfo: str,
    control: RunControl,
    context: LambdaContextLike,
    logger: Logger,
    progress: ProgressMetrics,
) -> _Finished:
    """After the drain: continue if work is left, measure the backlog, (a scheduled run, or
    one that stands in for it) delete finished jobs past their retention, and move the safety
    net; the figures go out as gauges."""
    continued = _continue(run.trigger, result, run.settings, context, logger)
    depth = _after_drain(
        run.settings, conninfo, run.budget, run.trigger, result, control, continued
    )
    stands_in = _stands_in_for_the_safety_net(run, result, continued)
    deleted = None
    first = control.retention_deleted  # the batch that went with the run's exit, if any
    if first is not None:
        deleted = retention.after_first_batch(*first)
        _retention_ran(logger, run.settings, deleted)
        if not deleted.complete:  # more past retention than one batch: carry on
            deleted = _retention(run.settings, conninfo, run.budget, logger, deleted)
    elif result.stop_reason != "error" and (
        run.trigger.housekeeping or (stands_in and _retention_due(run.settings))
    ):
        deleted = _retention(run.settings, conninfo, run.budget, logger)
    if deleted is not None:
        progress.gauge(DELETED_METRIC, deleted.done + deleted.failed, MetricUnit.Count)
    if depth is not None:
        progress.gauge(DEPTH_METRIC, depth.ready, MetricUnit.Count)
        progress.gauge(AGE_METRIC, round(depth.oldest_ready_age_s, 3), MetricUnit.Seconds)
    slid = None
    if stands_in:
        slid = SafetyNet(run.settings, _target(context), count=progress.count).slide()
    return _Finished(result, continued, depth, deleted, slid)


def _queue_list(trigger: events.Trigger) -> list[str] | None:
    """The run's queues as its log and summary say them (null: every queue)."""
    return None if trigger.queues is None else list(trigger.queues)


def _covers_the_function(settings: Settings, trigger: events.Trigger) -> bool:
    """Does the run drain every queue the function drains?"""
    if trigger.queues is None:
        return True
    return settings.queues is not None and set(settings.queues) <= set(trigger.queues)


def _stands_in_for_the_safety_net(run: _Invocation, result: DrainResult, continued: bool) -> bool:
    """A run that found every queue of the function empty has done what a safety-net run does
    (pgdrain.aws.safety_net): the next one is due ScheduleRate after it."""
    every_queue = _covers_the_function(run.settings, run.trigger)
    return every_queue and result.stop_reason == "empty" and not continued


def _retention_due(settings: Settings) -> bool:
    """Retention in a run that stands in for the safety net: once per ScheduleRate in this
    execution environment (a busy function's runs keep its table trimmed, a quiet one's first
    run does)."""
    if settings.schedule_rate_seconds is None:
        return False
    with _retention_lock:
        last = _retention_ran_at
    return last is None or time.monotonic() - last >= settings.schedule_rate_seconds


def _retention_with_exit(
    settings: Settings, trigger: events.Trigger
) -> Callable[[], store.Statement[store.RetentionBatch] | None]:
    """The retention batch a run sends with its exit (RunControl.before_exit), asked for when
    the run is about to exit on an empty claim: in a scheduled run, and in a run that stands in
    for the safety net (it covers every queue of the function) when retention is due."""

    def batch() -> store.Statement[store.RetentionBatch] | None:
        every_queue = _covers_the_function(settings, trigger)
        if trigger.housekeeping or (every_queue and _retention_due(settings)):
            return retention.first_batch(settings.retain_done_days, settings.retain_failed_days)
        return None

    return batch


def _skip_tick(
    run: _Invocation, context: LambdaContextLike, logger: Logger
) -> dict[str, Any] | None:
    """A tick of the rate schedule while the sliding safety net's run is pending: a run ended
    less than ScheduleRate ago having found every queue empty, so this one returns without
    touching the database (None: it runs)."""
    pending = SafetyNet(run.settings, _target(context)).pending()
    if pending is None:
        return None
    summary: dict[str, Any] = {"ok": True, "trigger": run.trigger.reason, "skipped": True}
    summary["safety_net_at"] = pending.isoformat()
    logger.info("safety net pending; this tick touches no database", extra=summary)
    return summary


def _summary(
    trigger: events.Trigger, finished: _Finished, control: RunControl, logger: Logger
) -> dict[str, Any]:
    """What the invocation returns, said in one closing line."""
    result, depth, deleted = finished.result, finished.depth, finished.deleted
    summary: dict[str, Any] = {
        "ok": result.stop_reason != "error",
        "error": result.error,
        "trigger": trigger.reason,
        "queues": _queue_list(trigger),
        "chain": trigger.chain,
        "result": result.as_dict(),
        "continued": finished.continued,
        "queue_depth": None if depth is None else depth.ready,
        # Scheduled runs only: finished jobs deleted past PGDRAIN_RETAIN_DONE/_FAILED.
        "retention": None if deleted is None else deleted.as_dict(),
        **control.summary(),
        **({} if finished.safety_net is None else finished.safety_net.as_dict()),
    }
    if result.stop_reason == "error":
        logger.error("run failed: %s", result.error)
    else:
        logger.info(
            "run finished",
            extra={
                "stop_reason": result.stop_reason,
                "continued": finished.continued,
                "done": result.done,
                **({"unserved": result.unserved} if result.unserved else {}),
                **control.summary(),
            },
        )
    return summary


class JobsAbandoned(RuntimeError):
    """A run returned with jobs still running (they outlasted its budget)."""


def _control(
    settings: Settings,
    trigger: events.Trigger,
    budget: Budget,
    worker_id: str,
    context: LambdaContextLike,
    count: Callable[[str, int], None],
    registry: Registry,
) -> RunControl:
    """The run's control plane. Under `sam local invoke` / `pgdrain invoke` it neither spawns
    nor schedules (the wake-up time is only reported)."""
    target = _target(context)
    return RunControl(
        trigger,
        worker_id,
        budget,
        waker=Waker(settings, target, count=count),
        spawner=Spawner(settings, trigger, budget, target, invoke_async, count=count),
        max_runs=settings.max_runs,
        queue_limits=settings.queue_limits,
        queue_rates=settings.queue_rates,
        # A burst of kicks closer together than the debounce window is one invocation.
        linger_window_s=settings.kick_debounce_seconds,
        reserve_seconds=settings.reserve_seconds,
        # While it claims, the run holds its queues' kicks, renewed every half hold.
        kick_hold_s=kick_hold_seconds(settings),
        periodics=registry.periodics,
        retention_batch=_retention_with_exit(settings, trigger),
        retention_limit_ms=round(retention.MAX_SECONDS * 1000),
        done_kept=settings.keeps_done,
    )


def _target(context: LambdaContextLike) -> str | None:
    """The function's unqualified ARN (the wake-up role and the function's own policy name
    exactly that), or None under `sam local invoke` / `pgdrain invoke`."""
    if os.environ.get(SAM_LOCAL_VARIABLE) == "true":
        return None
    return ":".join(context.invoked_function_arn.split(":")[:7])


def _drain(
    run: _Invocation, budget: Budget, observer: Observer, control: RunControl
) -> tuple[DrainResult, str]:
    settings = run.settings
    conninfo = resolve_conninfo(settings)
    result = drain(
        settings,
        budget,
        run.registry,
        conninfo,
        queues=run.trigger.queues,
        worker_id=run.worker_id,
        observer=observer,
        hooks=control,
    )
    if not (_failed_before_work(result) and settings.db_secret_arn and not settings.database_url):
        return result, conninfo
    # The cached secret may be stale (a rotation): read it again, and if it changed, try again.
    fresh = resolve_conninfo(settings, force_fetch=True)
    if fresh == conninfo or budget.exhausted(settings.reserve_seconds):
        return result, conninfo
    log.warning("the secret changed since it was cached; retrying with the new credentials")
    result = drain(
        settings,
        budget,
        run.registry,
        fresh,
        queues=run.trigger.queues,
        worker_id=run.worker_id,
        observer=observer,
        hooks=control,
    )
    return result, fresh


def _retention(
    settings: Settings,
    conninfo: str,
    budget: Budget,
    logger: Logger,
    already: retention.RetentionResult | None = None,
) -> retention.RetentionResult | None:
    """Delete finished jobs past their retention, within retention.MAX_SECONDS and never into
    the reserve, on a short connection of its own (`already`: what the batch sent with the
    run's exit deleted). A failure is logged and skipped: the next scheduled run tries again."""
    started = budget.remaining()
    share = Budget(
        lambda: min(
            retention.MAX_SECONDS - (started - budget.remaining()),
            budget.remaining() - settings.reserve_seconds,
        )
    )
    if share.exhausted(retention.MIN_REMAINING_SECONDS):
        return already
    deleted = retention.run_on_a_connection_of_its_own(conninfo, settings, share, logger)
    if deleted is None:
        return already
    if already is not None:
        deleted = deleted._replace(
            done=already.done + deleted.done,
            failed=already.failed + deleted.failed,
            runs=already.runs + deleted.runs,
        )
    _retention_ran(logger, settings, deleted)
    return deleted


def _retention_ran(logger: Logger, settings: Settings, deleted: retention.RetentionResult) -> None:
    global _retention_ran_at
    with _retention_lock:
        _retention_ran_at = time.monotonic()
    retention.log_result(logger, settings, deleted)


def _failed_before_connecting(trigger: events.Trigger, exc: PgdrainError) -> dict[str, Any]:
    """The answer of a run that found no database to reach: its error and its class,
    configuration or unavailable (Secrets Manager unreached)."""
    return {
        "ok": False,
        "error": str(exc),
        "error_kind": error_kind(exc),
        "trigger": trigger.reason,
    }


def _failed_before_work(result: DrainResult) -> bool:
    """The database refused the credentials: the cached secret may have been rotated."""
    return result.error_kind == "authentication"


def _continue(
    trigger: events.Trigger,
    result: DrainResult,
    settings: Settings,
    context: LambdaContextLike,
    logger: Logger,
) -> bool:
    """Invoke this function again when the budget ran out with ready jobs left, up to
    PGDRAIN_MAX_CHAIN times in a row. An empty queue never continues."""
    if result.stop_reason != "budget" or not result.more_ready:
        return False
    next_chain = trigger.chain + 1
    if next_chain > settings.max_chain:
        logger.warning(
            "work left, but the continuation cap is reached; a wake-up starts a new chain",
            extra={"max_chain": settings.max_chain},
        )
        return False
    if os.environ.get(SAM_LOCAL_VARIABLE) == "true":
        logger.info("work left; a local invoke does not continue itself")
        return False
    from botocore.exceptions import BotoCoreError, ClientError

    function = context.invoked_function_arn
    try:
        invoke_async(function, events.continue_event(trigger.queues, next_chain))
    except (BotoCoreError, ClientError, RuntimeError) as exc:
        logger.error("continuation failed; the schedule drains the rest: %s", exc)
        return False
    logger.info("work left: continued", extra={"next_chain": next_chain})
    return True


def _after_drain(
    settings: Settings,
    conninfo: str,
    budget: Budget,
    trigger: events.Trigger,
    result: DrainResult,
    control: RunControl,
    continued: bool,
) -> store.QueueDepth | None:
    """The backlog the run leaves: what its exit check counted when it stopped because nothing
    was claimable (jobs a full limit holds back); measured on a short connection when it
    stopped for time, which also ends the run's control-plane state (kick window,
    registration) and makes sure of its wake-up; unknown after an error or near
    the deadline (a run that abandoned jobs is retried by Lambda instead)."""
    if result.stop_reason == "empty":
        # Nothing was claimable, yet a queue at its concurrency limit may hold ready jobs back:
        # counted with the exit check, so that a full queue's backlog still raises the alarms.
        return control.exit_depth or store.QueueDepth(ready=0, oldest_ready_age_s=0.0)
    if result.stop_reason != "budget":
        return None
    if budget.remaining() < EXIT_MIN_REMAINING_SECONDS:
        log.warning(
            "too little time left to end the run and make its wake-up: work due later waits "
            "for the next kick or the safety net",
            extra={"remaining_s": round(budget.remaining(), 3)},
        )
        return None
    quick = dataclasses.replace(
        settings, connect_timeout=max(0.5, min(settings.connect_timeout, budget.remaining() - 1))
    )
    session = Session(conninfo, quick, budget)
    try:
        session.open()
        control.after_budget(session, continued)  # first: the wake-up matters more
        if budget.remaining() < DEPTH_MIN_REMAINING_SECONDS:
            return None
        return session.run(store.queue_depth, trigger.queues)
    except (PgdrainError, psycopg.Error) as exc:
        log.warning("could not measure the queue depth: %s", exc)
        return None
    finally:
        session.close()
