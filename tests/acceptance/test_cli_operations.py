"""The operator's commands, run as a user runs them against a real PostgreSQL: see what
happened (jobs with filters, --json, jobs show, stats, stats --watch) and fix it (retry by id
or by filter with --dry-run, cancel, purge --dry-run --queue, parked jobs retried on purpose).
Bad input to each: one line, exit 2, nothing written."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    ROOT,
    TIMEOUT_SECONDS,
    Run,
    only_line,
    run_pgdrain,
)
from helpers.fixtures import claim_batch, complete_one, job_row, wait_for
from helpers.history import day_partition_exists, finish_within_day, make_day_partition
from pgdrain import enqueue
from pgdrain.cli import embedded
from pgdrain.db import store

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent


def _env(url: str, **extra: str) -> dict[str, str]:
    return {
        "DATABASE_URL": url,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE)]),
        "PGDRAIN_JOBS": "operator_jobs",
        **extra,
    }


def pgdrain(url: str, *args: str, **env: str) -> Run:
    run = run_pgdrain(*args, env=_env(url, **env))
    assert "Traceback" not in run.err, run.err
    return run


def _status(conn: Conn, job_id: int) -> str:
    return str(job_row(conn, job_id)["status"])


def _finish(conn: Conn, job_id: int, status: str, days_ago: float = 0.0) -> None:
    """Put a job straight into a finished state, `days_ago` days ago."""
    conn.execute(
        "UPDATE pgdrain.jobs SET status = %s, attempts = 1,"
        " finished_at = now() - %s * interval '1 day', updated_at = now() - %s * interval '1 day'"
        " WHERE id = %s",
        (status, days_ago, days_ago, job_id),
    )


def _expire_lease(conn: Conn, job_id: int) -> None:
    conn.execute(
        "UPDATE pgdrain.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s",
        (job_id,),
    )


# -- seeing what happened ---------------------------------------------------------------------


def test_jobs_filters_by_queue_kind_status_and_since(conn: Conn, db_url: str) -> None:
    a = enqueue(conn, "ok", queue="alpha")
    b = enqueue(conn, "wait", queue="alpha")
    c = enqueue(conn, "ok", queue="beta")
    old = enqueue(conn, "ok", queue="alpha")
    _finish(conn, c, "failed")
    _finish(conn, old, "done", days_ago=3)

    def ids(*args: str) -> list[int]:
        run = pgdrain(db_url, "jobs", "--json", *args)
        assert (run.code, run.err) == (EXIT_OK, ""), run
        return [job["id"] for job in json.loads(run.out)]

    assert ids() == [old, c, b, a]  # newest first
    assert ids("--queue", "alpha") == [old, b, a]
    assert ids("--kind", "ok", "--queue", "alpha") == [old, a]
    assert ids("--status", "failed") == [c]
    assert ids("--status", "failed", "--status", "done") == [old, c]
    assert ids("--since", "1d") == [c, b, a]
    assert ids("--since", "2000-01-01T00:00:00") == [old, c, b, a]
    assert ids("--limit", "1") == [old]


def test_jobs_json_has_the_documented_fields(conn: Conn, db_url: str) -> None:
    enqueue(conn, "ok", {"x": 1}, queue="alpha")
    run = pgdrain(db_url, "jobs", "--json")
    [job] = json.loads(only_line(run.out))
    assert set(job) == {
        "id",
        "queue",
        "kind",
        "status",
        "priority",
        "attempts",
        "max_attempts",
        "reclaim_count",
        "run_at",
        "lease_expires_at",
        "created_at",
        "updated_at",
        "finished_at",
        "last_error",
        "state",
        "sequence",
        "depends_on",
        "progress",
        "output",
        "queue_paused",
    }
    assert (job["queue"], job["kind"], job["status"], job["finished_at"]) == (
        "alpha",
        "ok",
        "queued",
        None,
    )
    assert job["created_at"].endswith("+00:00")  # ISO 8601 with its offset


def test_jobs_show_prints_every_field_and_the_error_history(conn: Conn, db_url: str) -> None:
    job_id = enqueue(conn, "ok", {"order": 42}, queue="alpha", idempotency_key="order-42")
    history = [
        {"attempt": 1, "at": "2026-01-01T00:00:00Z", "type": "ValueError", "message": "bad"},
        {
            "attempt": 2,
            "at": "2026-01-01T00:00:10Z",
            "type": "KeyError",
            "message": "'sku'",
            "traceback": 'Traceback (most recent call last):\n  File "jobs.py", line 3',
        },
    ]
    conn.execute(
        "UPDATE pgdrain.jobs SET errors = %s, last_error = 'KeyError' WHERE id = %s",
        (psycopg.types.json.Jsonb(history), job_id),
    )

    text = pgdrain(db_url, "jobs", "show", str(job_id))
    assert (text.code, text.err) == (EXIT_OK, "")
    columns = {
        str(r[0])
        for r in conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'pgdrain' AND table_name = 'jobs'"
        )
    }
    shown = {line.split()[0] for line in text.out.splitlines() if not line.startswith(" ")}
    assert columns - {"errors"} <= shown  # every column, by name
    assert "errors (2):" in text.out
    assert "attempt 2 at 2026-01-01T00:00:10Z: KeyError: 'sku'" in text.out
    assert '    File "jobs.py", line 3' in text.out
    assert "order-42" in text.out and '{"order": 42}' in text.out

    as_json = pgdrain(db_url, "jobs", "show", str(job_id), "--json")
    job = json.loads(only_line(as_json.out))
    assert set(job) == columns
    assert (job["id"], job["payload"], job["errors"]) == (job_id, {"order": 42}, history)


def test_jobs_show_of_an_unknown_job_fails_in_one_line(db_url: str) -> None:
    run = pgdrain(db_url, "jobs", "show", "999")
    assert (run.code, run.out) == (EXIT_FAILURE, "")
    assert only_line(run.err) == "pgdrain: error: no job 999"


def test_stats_counts_what_an_operator_reads_first(conn: Conn, db_url: str) -> None:
    ready = [enqueue(conn, "ok") for _ in range(3)]
    enqueue(conn, "ok", delay=600)
    running = enqueue(conn, "ok", queue="other")
    claim_batch(conn, ["other"], 1, "w", 30.0, None)
    _finish(conn, ready[0], "failed")
    parked = enqueue(conn, "ok", queue="other", recovery_policy="manual")
    claim_batch(conn, ["other"], 1, "w", 30.0, None)
    _expire_lease(conn, parked)
    store.job_reclaim_expired(conn, 10)
    assert _status(conn, running) == "running"

    run = pgdrain(db_url, "stats", "--json")
    stats = {s["queue"]: s for s in json.loads(run.out)}
    default, other = stats["default"], stats["other"]
    assert (default["ready"], default["delayed"], default["failed"]) == (2, 1, 1)
    assert default["oldest_ready_age_s"] >= 0.0
    assert (other["running"], other["parked"], other["ready"]) == (1, 1, 0)

    table = pgdrain(db_url, "stats")
    header = table.out.splitlines()[1].split()
    assert header[:7] == ["queue", "ready", "running", "delayed", "waiting", "failed", "parked"]


def test_stats_counts_the_jobs_a_sequence_or_dependencies_hold_back(
    conn: Conn, db_url: str
) -> None:
    """Three jobs of one sequence, and one after another job: one of the sequence is ready, the
    rest wait. `stats` shows every one, not only the ready ones, in a queue of its own too."""
    first = enqueue(conn, "ok", sequence="customer-7")
    enqueue(conn, "ok", sequence="customer-7")
    enqueue(conn, "ok", sequence="customer-7")
    enqueue(conn, "ok", queue="reports", after=[first])

    stats = {s["queue"]: s for s in json.loads(pgdrain(db_url, "stats", "--json").out)}
    assert (stats["default"]["ready"], stats["default"]["waiting"]) == (1, 2)
    # A queue whose only job waits is listed all the same.
    assert (stats["reports"]["ready"], stats["reports"]["waiting"]) == (0, 1)
    line = next(x for x in pgdrain(db_url, "stats").out.splitlines() if x.startswith("reports"))
    assert line.split()[1:5] == ["0", "0", "0", "1"]

    pgdrain(db_url, "drain", "--json", "--budget", "30")
    after = json.loads(pgdrain(db_url, "stats", "--json").out)
    assert [s["waiting"] for s in after] == [0, 0]  # all ran: nothing waits


def _start_watch(url: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
    env.update(_env(url))
    return subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", "stats", *args],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_stats_watch_redraws_until_ctrl_c_then_exits_0(conn: Conn, db_url: str) -> None:
    enqueue(conn, "ok")
    watch = _start_watch(db_url, "--watch", "0.5", "--json")
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        enqueue(conn, "ok")
        # The view redraws: a later line shows the second job (read until it does; a watch
        # that stopped redrawing fails on the empty line of its ended output).
        for _ in range(1000):
            if json.loads(watch.stdout.readline())[0]["ready"] == 2:
                break
        else:
            raise AssertionError("the watch never showed the second job")
        assert first[0]["ready"] == 1
        watch.send_signal(signal.SIGINT)
        _out, err = watch.communicate(timeout=TIMEOUT_SECONDS)
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
    assert (watch.returncode, err) == (EXIT_OK, "")


# -- fixing it --------------------------------------------------------------------------------


def test_retry_by_filter_dry_run_changes_nothing_and_names_what_would(
    conn: Conn, db_url: str
) -> None:
    alpha = [enqueue(conn, "ok", queue="alpha") for _ in range(2)]
    beta = enqueue(conn, "ok", queue="beta")
    other_kind = enqueue(conn, "wait", queue="alpha")
    for job_id in (*alpha, beta, other_kind):
        _finish(conn, job_id, "failed")

    dry = pgdrain(db_url, "retry", "--failed", "--queue", "alpha", "--kind", "ok", "--dry-run")
    assert (dry.code, dry.err) == (EXIT_OK, "")
    assert dry.out.splitlines()[0] == "would queue again: 2 jobs"
    assert [int(line.split()[0]) for line in dry.out.splitlines()[1:]] == alpha
    assert {_status(conn, j) for j in (*alpha, beta, other_kind)} == {"failed"}

    real = pgdrain(db_url, "retry", "--failed", "--queue", "alpha", "--kind", "ok")
    assert real.out.replace("queued again", "would queue again") == dry.out
    assert [_status(conn, j) for j in alpha] == ["queued", "queued"]
    assert [job_row(conn, j)["attempts"] for j in alpha] == [0, 0]
    assert (_status(conn, beta), _status(conn, other_kind)) == ("failed", "failed")

    again = pgdrain(db_url, "retry", "--failed", "--queue", "alpha", "--kind", "ok")
    assert again.out.splitlines() == ["queued again: 0 jobs"]  # safe to run twice


def test_retry_names_a_job_whose_key_is_held_and_retries_the_others(
    conn: Conn, db_url: str
) -> None:
    """The issue's timeline, each command a process of its own: a job with key K1 fails, K1
    enqueues a new job (the key was freed), an unrelated job fails; `retry --failed` (it used
    to fail on jobs_active_key_idx, exit 1, retrying nothing, `--dry-run` too)."""
    first = int(pgdrain(db_url, "enqueue", "ok", "--key", "K1").out.split()[-1])
    _finish(conn, first, "failed")
    holder_run = pgdrain(db_url, "enqueue", "ok", "--key", "K1")
    holder = int(holder_run.out.split()[-1])
    assert holder != first
    unrelated = enqueue(conn, "wait")
    _finish(conn, unrelated, "failed")

    held_line = f"{first:>8} default      ok (key held by job {holder})"
    dry = pgdrain(db_url, "retry", "--failed", "--dry-run")
    assert (dry.code, dry.err) == (EXIT_OK, "")
    assert dry.out.splitlines() == [
        "would queue again: 1 job",
        f"{unrelated:>8} default      wait",
        "not retried: 1 job",
        held_line,
    ]
    by_id = pgdrain(db_url, "retry", str(first), "--dry-run")
    assert (by_id.code, by_id.err) == (EXIT_OK, "")
    assert by_id.out.splitlines() == [
        "would queue again: none",
        f"not retried: {first} (key held by job {holder})",
    ]
    assert (_status(conn, first), _status(conn, unrelated)) == ("failed", "failed")

    real = pgdrain(db_url, "retry", "--failed")
    assert (real.code, real.err) == (EXIT_OK, "")
    assert real.out.replace("queued again", "would queue again") == dry.out
    assert [_status(conn, j) for j in (first, holder, unrelated)] == ["failed", "queued", "queued"]


def test_retry_since_takes_only_recent_failures(conn: Conn, db_url: str) -> None:
    recent, old = enqueue(conn, "ok"), enqueue(conn, "ok")
    _finish(conn, recent, "failed")
    _finish(conn, old, "failed", days_ago=2)
    run = pgdrain(db_url, "retry", "--failed", "--since", "1d")
    assert run.out.splitlines()[0] == "queued again: 1 job"
    assert (_status(conn, recent), _status(conn, old)) == ("queued", "failed")


def test_a_parked_job_is_listed_counted_and_retried_on_purpose(conn: Conn, db_url: str) -> None:
    """Two jobs whose run died (lease expired), one variable apart: recovery_policy. The drain
    that reclaims them runs the auto one again and parks the manual one until a person acts."""
    manual = enqueue(conn, "ok", recovery_policy="manual")
    auto = enqueue(conn, "ok")
    claim_batch(conn, ["default"], 2, "a-run-that-died", 30.0, None)
    _expire_lease(conn, manual)
    _expire_lease(conn, auto)

    drained = pgdrain(db_url, "drain", "--json", "--budget", "30")
    assert drained.code == EXIT_OK, drained
    assert (_status(conn, auto), _status(conn, manual)) == ("done", "parked")

    listed = pgdrain(db_url, "jobs", "--status", "parked", "--json")
    assert [j["id"] for j in json.loads(listed.out)] == [manual]
    assert "lease expired" in json.loads(listed.out)[0]["last_error"]
    [stats] = json.loads(pgdrain(db_url, "stats", "--json").out)
    assert (stats["parked"], stats["failed"]) == (1, 0)
    # A later drain leaves it alone: parked waits for a person.
    pgdrain(db_url, "drain", "--json", "--budget", "30")
    assert _status(conn, manual) == "parked"

    retried = pgdrain(db_url, "retry", str(manual))
    assert (retried.code, retried.out.strip()) == (EXIT_OK, f"queued again: [{manual}]")
    pgdrain(db_url, "drain", "--json", "--budget", "30")
    assert _status(conn, manual) == "done"


def test_retry_parked_by_filter(conn: Conn, db_url: str) -> None:
    parked = enqueue(conn, "ok", recovery_policy="manual")
    failed = enqueue(conn, "ok")
    claim_batch(conn, ["default"], 1, "w", 30.0, None)
    _expire_lease(conn, parked)
    store.job_reclaim_expired(conn, 10)
    _finish(conn, failed, "failed")
    run = pgdrain(db_url, "retry", "--parked")
    assert run.out.splitlines()[0] == "queued again: 1 job"
    assert (_status(conn, parked), _status(conn, failed)) == ("queued", "failed")


def test_retry_of_a_job_cancelled_while_running_says_when_it_runs(conn: Conn, db_url: str) -> None:
    """The operator's timeline, each command a process of its own: cancel a running job, retry
    it. Its cancelled attempt may run until its lease ends: the retry queues it for then, says
    so, and a drain meanwhile does not run it a second time at once."""
    job_id = enqueue(conn, "ok")
    claim_batch(conn, ["default"], 1, "a-run-still-going", 300.0, None)
    lease_end = job_row(conn, job_id)["lease_expires_at"]
    assert pgdrain(db_url, "cancel", str(job_id)).code == EXIT_OK

    dry = pgdrain(db_url, "retry", str(job_id), "--json", "--dry-run")
    assert json.loads(dry.out)["waits_for_lease"] == {str(job_id): lease_end.isoformat()}
    run = pgdrain(db_url, "retry", str(job_id))
    assert (run.code, run.err) == (EXIT_OK, "")
    utc = lease_end.astimezone(dt.UTC)
    assert run.out.splitlines()[:2] == [
        f"queued again: [{job_id}]",
        f"job {job_id} runs from {utc:%Y-%m-%d %H:%M:%S} UTC: it was cancelled while running,"
        " and that attempt may run until its lease ends",
    ]
    drained = pgdrain(db_url, "drain", "--json", "--budget", "30")
    assert json.loads(drained.out)["claimed"] == 0
    assert (_status(conn, job_id), job_row(conn, job_id)["run_at"]) == ("queued", lease_end)


def test_cancel_a_queued_job_and_it_never_runs(conn: Conn, db_url: str) -> None:
    cancelled, kept = enqueue(conn, "ok"), enqueue(conn, "ok")
    run = pgdrain(db_url, "cancel", str(cancelled))
    assert (run.code, run.out.strip()) == (EXIT_OK, f"cancelled {cancelled} (was queued)")
    drained = pgdrain(db_url, "drain", "--json", "--budget", "30")
    assert json.loads(drained.out)["done"] == 1
    assert (_status(conn, cancelled), _status(conn, kept)) == ("cancelled", "done")
    assert job_row(conn, cancelled)["attempts"] == 0  # never claimed

    # Safe to repeat (exit 0, said): a cancelled or finished job is left as it is. Only a job
    # that does not exist is an error.
    twice = pgdrain(db_url, "cancel", str(cancelled), str(kept))
    assert (twice.code, twice.err) == (EXIT_OK, ""), twice
    assert twice.out.splitlines() == [
        f"job {cancelled} is already cancelled: nothing to cancel",
        f"job {kept} is already finished (done): nothing to cancel",
    ]
    unknown = pgdrain(db_url, "cancel", str(cancelled), "424242")
    assert unknown.code == EXIT_FAILURE
    assert only_line(unknown.err) == "pgdrain: error: no job 424242"


@pytest.mark.parametrize("cancel", [True, False], ids=["cancelled", "control: not cancelled"])
def test_cancel_a_running_job_tells_it_and_refuses_its_outcome(
    conn: Conn, db_url: str, tmp_path: Path, cancel: bool
) -> None:
    """A real drain runs a job that waits for job.lease_lost(). Cancelling it is seen by the
    drain's heartbeat, the job is told, and its completion is refused; the control releases the
    job instead, on the same timeline, and its completion is accepted."""
    files = {name: str(tmp_path / name) for name in ("started", "release", "seen")}
    job_id = enqueue(conn, "wait", files)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
    env.update(_env(db_url, PGDRAIN_LEASE_SECONDS="3"))  # a heartbeat every second
    drain = subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", "drain", "--json", "--budget", "60"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: Path(files["started"]).exists(), what="the job to start")
        if cancel:
            run = pgdrain(db_url, "cancel", str(job_id))
            assert run.out.startswith(f"cancelled {job_id} (was running)"), run
        else:
            Path(files["release"]).write_text("go", encoding="utf-8")
        out, _err = drain.communicate(timeout=TIMEOUT_SECONDS)
    finally:
        if drain.poll() is None:
            drain.kill()
            drain.wait()
    result = json.loads(out.strip().splitlines()[-1])
    seen = Path(files["seen"]).read_text(encoding="utf-8")
    row = job_row(conn, job_id)
    if cancel:
        assert seen == "lease lost"
        assert (row["status"], row["completed_token"]) == ("cancelled", None)
        assert (result["done"], result["cancelled"], result["lease_lost"]) == (0, 1, 0)
    else:
        assert seen == "released"
        assert row["status"] == "done" and row["completed_token"] is not None
        assert (result["done"], result["cancelled"], result["lease_lost"]) == (1, 0, 0)


def test_cancel_revokes_the_lease_so_every_fenced_write_is_refused(conn: Conn, db_url: str) -> None:
    """The holder's own statements after a cancel: heartbeat, completion and failure all match
    nothing, and the row stays cancelled."""
    job_id = enqueue(conn, "ok")
    [claimed] = claim_batch(conn, ["default"], 1, "w", 30.0, None)
    assert pgdrain(db_url, "cancel", str(job_id)).code == EXIT_OK
    assert store.job_extend_leases(conn, [claimed.held], 30.0, None).lost == {job_id}
    assert not complete_one(conn, claimed.held)
    assert store.job_fail(conn, claimed.held, "boom", 1.0) == store.LeaseLost(job_id)
    assert _status(conn, job_id) == "cancelled"


def test_purge_dry_run_counts_and_queue_limits(conn: Conn, db_url: str) -> None:
    old_alpha = [enqueue(conn, "ok", queue="alpha") for _ in range(3)]
    old_beta = enqueue(conn, "ok", queue="beta")
    young = enqueue(conn, "ok", queue="alpha")
    parked = enqueue(conn, "ok", queue="alpha")
    for job_id, status in zip(old_alpha, ("done", "failed", "cancelled"), strict=True):
        _finish(conn, job_id, status, days_ago=10)
    _finish(conn, old_beta, "done", days_ago=10)
    _finish(conn, young, "done", days_ago=1)
    conn.execute("UPDATE pgdrain.jobs SET status = 'parked' WHERE id = %s", (parked,))

    dry = pgdrain(db_url, "purge", "--dry-run", "--queue", "alpha")
    assert (dry.code, dry.out.strip()) == (EXIT_OK, "would delete 3 finished jobs in queue 'alpha'")
    assert conn.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (6,)

    real = pgdrain(db_url, "purge", "--queue", "alpha")
    assert real.out.strip() == "deleted 3 finished jobs in queue 'alpha'"
    left = {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")}
    assert left == {old_beta, young, parked}


@pytest.mark.parametrize(
    ("queue_args", "dropped"),
    [((), True), (("--queue", "default"), False)],
    ids=["every-queue", "control: one queue, by rows"],
)
def test_purge_drops_whole_days_of_done_jobs_and_counts_their_jobs(
    conn: Conn, db_url: str, queue_args: tuple[str, ...], dropped: bool
) -> None:
    """Was: purge deleted every done job row by row, its day's partition included, where
    retention drops the partition. Now a purge of every queue drops each whole day past the
    age and says how many jobs it held; what is left goes by rows. The control names one
    queue: a day's partition holds every queue's jobs, so there only rows go. Both delete the
    same jobs and say the same count, which is also --dry-run's."""
    make_day_partition(conn, -10)
    in_the_old_day = [enqueue(conn, "ok") for _ in range(3)]
    old_failed, young = enqueue(conn, "ok"), enqueue(conn, "ok")
    for job_id in in_the_old_day:
        _finish(conn, job_id, "done")
    finish_within_day(conn, in_the_old_day, -10)
    _finish(conn, old_failed, "failed", days_ago=40)
    _finish(conn, young, "done", days_ago=1)
    dry = pgdrain(db_url, "purge", "--older-than-days", "7", "--dry-run", "--json", *queue_args)
    assert json.loads(dry.out)["deleted"] == 4

    real = pgdrain(db_url, "purge", "--older-than-days", "7", "--json", *queue_args)

    assert (real.code, json.loads(real.out)["deleted"], real.err) == (EXIT_OK, 4, "")
    assert {int(r[0]) for r in conn.execute("SELECT id FROM pgdrain.jobs")} == {young}
    assert day_partition_exists(conn, -10) is not dropped


# -- --help and bad input ---------------------------------------------------------------------


def test_help_shows_defaults(db_url: str) -> None:
    run = pgdrain(db_url, "jobs", "--help")
    assert run.code == EXIT_OK
    assert "at most this many (default: 20)" in " ".join(run.out.split())


BAD_INPUT: list[tuple[str, Sequence[str], str]] = [
    ("jobs: unknown status", ["jobs", "--status", "paused"], "--status"),
    ("jobs: bad queue", ["jobs", "--queue", "no spaces"], "--queue"),
    ("jobs: bad since", ["jobs", "--since", "yesterday"], "--since"),
    ("jobs: since too far", ["jobs", "--since", "99999999d"], "--since"),
    ("jobs: limit 0", ["jobs", "--limit", "0"], "--limit"),
    ("jobs show: not an id", ["jobs", "show", "abc"], "id"),
    ("jobs show: no id", ["jobs", "show"], "id"),
    ("stats: watch 0", ["stats", "--watch", "0"], "--watch"),
    ("stats: watch not a number", ["stats", "--watch", "soon"], "--watch"),
    ("retry: nothing named", ["retry"], "name the jobs"),
    ("retry: filter without a status", ["retry", "--queue", "alpha"], "name the jobs"),
    ("retry: ids and a filter", ["retry", "1", "--failed"], "not both"),
    ("retry: bad kind", ["retry", "--failed", "--kind", ""], "--kind"),
    ("retry: bad id", ["retry", "-3"], ""),
    ("cancel: no id", ["cancel"], "ids"),
    ("cancel: not an id", ["cancel", "x1"], "ids"),
    ("purge: bad queue", ["purge", "--dry-run", "--queue", "a b"], "--queue"),
    ("purge: negative days", ["purge", "--older-than-days", "-1"], "--older-than-days"),
    ("purge: too many days", ["purge", "--older-than-days", "1e308"], "at most 36500 days"),
    ("server: no action", ["server"], "stop"),
    ("server: unknown action", ["server", "start"], "start"),
]


@pytest.mark.parametrize(
    ("args", "fragment"), [(a, f) for _, a, f in BAD_INPUT], ids=[i for i, _, _ in BAD_INPUT]
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
    conn: Conn, db_url: str, args: Sequence[str], fragment: str
) -> None:
    failed = enqueue(conn, "ok")
    _finish(conn, failed, "failed", days_ago=30)
    before = conn.execute("SELECT * FROM pgdrain.jobs ORDER BY id").fetchall()

    run = pgdrain(db_url, *args)

    assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), run
    line = only_line(run.err)
    assert line.startswith("pgdrain: ") and fragment in line, line
    assert conn.execute("SELECT * FROM pgdrain.jobs ORDER BY id").fetchall() == before


# -- the embedded server the CLI leaves running ------------------------------------------------


def test_server_stop_stops_the_embedded_postgresql_left_running() -> None:
    """With no DATABASE_URL the CLI starts an embedded PostgreSQL and leaves it running for
    the next command (shown first: it is still up after the command exits); `pgdrain server
    stop` stops it, keeps its data, and says so; a second stop finds nothing to stop.

    The data lives in a directory of its own, not under pytest's tmp_path: the server runs as
    another user (pgserver's, when root), and a pytest session starting meanwhile resets the
    permissions of /tmp/pytest-of-USER and removes old runs' folders under a live server."""
    with tempfile.TemporaryDirectory(prefix="pgdrain-server-stop-") as folder:
        data = Path(folder) / "pgdata"
        try:
            _stop_a_server_left_running(data)
        finally:
            embedded.stop(data)  # whatever failed above, leave no server running


def _stop_a_server_left_running(data: Path) -> None:
    env = {"PGDRAIN_DATA_DIR": str(data), "PYTHONPATH": str(ROOT / "handler")}
    drop = ("PGDRAIN_", "DATABASE_URL")

    migrated = run_pgdrain("migrate", env=env, drop=drop)
    assert migrated.code == EXIT_OK, migrated
    assert migrated.out.startswith("applied: 0001_init.sql, ")
    pid = int((data / "postmaster.pid").read_text().splitlines()[0])
    os.kill(pid, 0)  # still running after the command that started it exited

    # `server status` says so, and gives the URL psql takes (it connects).
    status = run_pgdrain("server", "status", env=env, drop=drop)
    assert (status.code, status.err) == (EXIT_OK, ""), status
    first, connect, *_ = status.out.splitlines()
    assert first == f"the embedded PostgreSQL in {data} is running"
    url = connect.removeprefix("connect: psql '").removesuffix("'")
    with psycopg.connect(url) as psql:
        assert psql.execute("SELECT count(*) FROM pgdrain.jobs").fetchone() == (0,)

    stopped = run_pgdrain("server", "stop", env=env, drop=drop)
    assert (stopped.code, stopped.out.strip(), stopped.err) == (
        EXIT_OK,
        f"stopped the embedded PostgreSQL in {data}",
        "",
    )
    assert not (data / "postmaster.pid").exists()
    assert (data / "PG_VERSION").exists()  # the data is kept
    again = run_pgdrain("server", "stop", env=env, drop=drop)
    assert (again.code, again.out.strip()) == (
        EXIT_OK,
        f"the embedded PostgreSQL in {data} is not running",
    )
    stopped_status = run_pgdrain("server", "status", env=env, drop=drop)
    assert stopped_status.out.startswith(f"the embedded PostgreSQL in {data} is not running")
    # The next command starts it again, with the schema it had.
    restarted = run_pgdrain("migrate", env=env, drop=drop)
    assert restarted.out.strip() == "nothing to apply: the schema is up to date"
    assert run_pgdrain("server", "stop", env=env, drop=drop).code == EXIT_OK


@pytest.mark.parametrize(
    ("given", "wrong"),
    [("afile", "is a file"), ("afile/sub", "cannot be made a folder"), (".", "holds other files")],
    ids=["a-file", "under-a-file", "not-postgresql"],
)
def test_a_data_dir_that_cannot_hold_the_embedded_server_is_one_line_exit_2(
    tmp_path: Path, given: str, wrong: str
) -> None:
    """A red team's report: each of these was mkdir's or initdb's traceback."""
    (tmp_path / "afile").write_text("not a folder\n")
    data = tmp_path / given
    env = {"PGDRAIN_DATA_DIR": str(data), "PYTHONPATH": str(ROOT / "handler")}
    run = run_pgdrain("stats", env=env, drop=("PGDRAIN_", "DATABASE_URL"))
    assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), run
    assert only_line(run.err).startswith(f"pgdrain: error: PGDRAIN_DATA_DIR {data} {wrong}")


# -- the demo ------------------------------------------------------------------------------------


def test_the_demo_prints_only_commands_that_run_as_printed(db_url: str) -> None:
    """`pgdrain demo`, then every command it printed, pasted into a shell as printed (its
    trailing `# why` is a shell comment); and its warnings are explained."""
    env = {"DATABASE_URL": db_url, "PYTHONPATH": str(ROOT / "handler")}
    demo = run_pgdrain("demo", "--count", "20", env=env)
    assert demo.code == EXIT_OK, demo
    lines = demo.out.splitlines()
    # The demo's migration says what `pgdrain migrate` says, in its words.
    assert lines[0] == run_pgdrain("migrate", env=env).out.strip()
    commands = [line.removeprefix("drain: ") for line in lines if " invoke -e " in line]
    commands += [line.strip() for line in lines if line.startswith("  ")]
    assert len(commands) == 7, demo.out
    explained = [line for line in lines if line.startswith("warnings: ")]
    assert explained == [
        "warnings: 1, as the demo intends: 1 job failed for good (the 'fail' kind; 'failed' below)"
    ], demo.out

    shell_env = {k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")}
    shell_env.update(env)
    for command in commands:
        done = subprocess.run(
            command,
            shell=True,
            cwd=ROOT,
            env=shell_env,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_SECONDS,
            check=False,
        )
        assert done.returncode == EXIT_OK, (command, done.stderr)
        if " jobs show " in command:  # the job it points at is the one that failed
            shown = dict(line.split(None, 1) for line in done.stdout.splitlines()[:4])
            assert (shown["kind"], shown["status"]) == ("fail", "failed"), done.stdout


def test_a_database_whose_datestyle_is_not_iso_is_read_by_every_command(
    conn: Conn, db_url: str
) -> None:
    """An operator's report: with the database's DateStyle `SQL, DMY`, `jobs`, `pause` and
    `runs` ended in a traceback (psycopg reads timestamps only in ISO). Each command's
    connection asks for ISO first."""
    name = conn.info.dbname
    conn.execute(f"ALTER DATABASE \"{name}\" SET DateStyle = 'SQL, DMY'")
    enqueue(conn, "ok")
    for args in (("jobs",), ("jobs", "--json"), ("pause", "q1"), ("runs",), ("stats",)):
        run = pgdrain(db_url, *args)
        assert (run.code, run.err) == (EXIT_OK, ""), (args, run.err[-300:])


def test_a_role_whose_triggers_do_not_fire_is_refused_in_one_line(
    conn: Conn, db_url: str, admin_url: str
) -> None:
    """A red team's report: with session_replication_role = replica (set on the database by a
    superuser), `pgdrain cancel` said it cancelled a job that went on to run: the view's
    trigger, which moves it, does not fire. Every operator command now refuses, in one line."""
    job_id = enqueue(conn, "ok")
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{conn.info.dbname}" SET session_replication_role = replica')
    run = pgdrain(db_url, "cancel", str(job_id))
    assert run.code == EXIT_BAD_INPUT
    assert "session_replication_role is 'replica'" in only_line(run.err)
    assert _status(conn, job_id) == "queued"


# -- a drain that leaves jobs at their queue's limits -------------------------------------------


@pytest.mark.parametrize("limited", [True, False])
def test_a_drain_names_the_ready_jobs_a_used_up_rate_holds_back(
    conn: Conn, db_url: str, limited: bool
) -> None:
    ids = [enqueue(conn, "ok", queue="alpha") for _ in range(5)]
    # A day's window: a drain that crossed an hour's edge would claim two more.
    limits = {"PGDRAIN_QUEUE_LIMITS": "alpha=2/1d"} if limited else {}
    run = pgdrain(db_url, "drain", "--budget", "30", **limits)
    assert run.code == EXIT_OK, run.err
    first, *rest = run.out.splitlines()
    assert "stopped: empty" in first  # nothing more it may claim now
    done = sum(_status(conn, i) == "done" for i in ids)
    if limited:
        assert done == 2
        assert rest == [
            "held by limits: 3 ready jobs in alpha (rate 2 per 86400s used up) "
            "(pgdrain.queue_limits, as a run's PGDRAIN_QUEUE_LIMITS wrote it; the next run, or "
            "`pgdrain worker`, claims them when a slot or window frees)"
        ]
    else:  # control: without the limit the same drain leaves nothing, and says nothing more
        assert (done, rest) == (5, [])


def test_a_retry_run_again_finds_its_jobs_pending_and_says_so(conn: Conn, db_url: str) -> None:
    """A red team's finding: a retry whose reply was lost had queued its jobs; run again, it
    called them "not failed, parked or cancelled (or unknown)" with exit 1. It now says they
    are already queued, and exits 0; an unknown id is still an error."""
    failed, done = enqueue(conn, "ok"), enqueue(conn, "ok")
    _finish(conn, failed, "failed")
    _finish(conn, done, "done")
    first = pgdrain(db_url, "retry", str(failed), PGDRAIN_KICK="off")
    assert first.code == EXIT_OK, first.err
    again = pgdrain(db_url, "retry", str(failed), PGDRAIN_KICK="off")
    assert (again.code, again.err) == (EXIT_OK, "")
    assert f"job {failed} is already queued: nothing to retry" in again.out
    as_json = pgdrain(db_url, "retry", str(failed), "--json", PGDRAIN_KICK="off")
    assert json.loads(as_json.out)["already_pending"] == {str(failed): "queued"}
    wrong = pgdrain(db_url, "retry", str(done), "999999", PGDRAIN_KICK="off")
    assert wrong.code == EXIT_FAILURE
    assert f"(or unknown): [{done}, 999999]" in wrong.err
