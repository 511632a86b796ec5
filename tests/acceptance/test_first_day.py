"""A team's first day (issue 42): the `pgdrain` command in a fresh process, run from the
team's own project directory outside the repository, with its own jobs module, as a user runs
it after `pip install`. Each trap the issue names, shown gone:

- a kind declared with queue="emails" is drained by a plain `pgdrain drain`; a restriction
  (PGDRAIN_QUEUES, --queues) says what it leaves, in the drain's summary and in `stats`;
- an unknown kind, or a jobs module that cannot be loaded, is refused at enqueue, and a
  registry without kinds at drain;
- an operator's cancel of a running job is said once, as what it is;
- messages a user can act on (migrate first, a database that does not exist, a budget under
  the reserve, a failed attempt in one short line);
- `jobs` with a header and the states of queued jobs told apart, an idle or unknown queue,
  `cancel` safe to repeat and by filter, --json on retry, cancel and purge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.cli import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    ROOT,
    TIMEOUT_SECONDS,
    Run,
    count_jobs,
    only_line,
    run_pgdrain,
)
from helpers.fixtures import job_row, wait_for
from pgdrain.db import store
from pgdrain.db.sql import migrations

Conn = psycopg.Connection[Any]

# The team's jobs module, in their project (jobs.py beside where they run `pgdrain`).
JOBS_MODULE = """
import time
from pathlib import Path

from pgdrain import Registry

jobs = Registry()


@jobs.job("hello")
def hello(job):
    print(f"hello, {job.payload['name']}")


@jobs.job("send_email", queue="emails")
def send_email(job):
    pass


@jobs.job("boom")
def boom(job):
    raise ValueError("no such user: 42")


@jobs.job("until_released")
def until_released(job):
    release = Path(job.payload["release"])
    while not release.exists():
        time.sleep(0.02)
"""


@dataclass(frozen=True)
class Project:
    """The team's project directory, and pgdrain importable as if installed (its package
    alone on the path: not the repository's handler/, whose own jobs.py would be found)."""

    folder: Path
    site: Path
    db_url: str

    def env(self, **extra: str) -> dict[str, str]:
        return {"DATABASE_URL": self.db_url, "PYTHONPATH": str(self.site), **extra}

    def run(self, *args: str, **env: str) -> Run:
        run = run_pgdrain(*args, env=self.env(**env), cwd=self.folder)
        assert "Traceback (most recent call last)" not in run.err or "-v" in args, run.err
        return run


@pytest.fixture
def project(tmp_path: Path, db_url: str) -> Project:
    return _project(tmp_path, db_url)


def _project(tmp_path: Path, db_url: str, jobs_module: str = JOBS_MODULE) -> Project:
    site = tmp_path / "site"
    site.mkdir()
    (site / "pgdrain").symlink_to(ROOT / "handler" / "pgdrain", target_is_directory=True)
    folder = tmp_path / "team-app"
    folder.mkdir()
    (folder / "jobs.py").write_text(jobs_module, encoding="utf-8")
    return Project(folder, site, db_url)


def _status(conn: Conn, job_id: int) -> tuple[str, int]:
    row = job_row(conn, job_id)
    return str(row["status"]), int(row["attempts"])


def _enqueued_id(run: Run) -> int:
    assert (run.code, run.err) == (EXIT_OK, ""), run
    return int(run.out.split()[-1])


# -- 1. every queue, unless restricted; a restriction says what it leaves ----------------------


def test_a_plain_drain_runs_a_job_of_a_kind_declared_in_another_queue(
    project: Project, conn: Conn
) -> None:
    """The README's "Use it": send_email is declared with queue="emails"."""
    email = _enqueued_id(project.run("enqueue", "send_email", "--payload", '{"user_id": 42}'))
    hello = _enqueued_id(project.run("enqueue", "hello", "--payload", '{"name": "world"}'))
    assert job_row(conn, email)["queue"] == "emails"

    drained = project.run("drain")

    assert drained.code == EXIT_OK, drained
    printed, summary = drained.out.splitlines()
    assert printed == "hello, world" and summary.startswith("claimed 2, done 2,"), drained
    assert _status(conn, email) == ("done", 1) and _status(conn, hello) == ("done", 1)


def test_a_restricted_drain_says_which_ready_jobs_it_leaves(project: Project, conn: Conn) -> None:
    email = _enqueued_id(project.run("enqueue", "send_email"))

    restricted = project.run("drain", PGDRAIN_QUEUES="default")
    assert restricted.code == EXIT_OK, restricted
    assert restricted.out.splitlines()[-1] == (
        "not drained: 1 ready job in a queue this drain does not serve (--queues, "
        "PGDRAIN_QUEUES): emails (1 ready)"
    )
    as_json = json.loads(only_line(project.run("drain", "--queues", "default", "--json").out))
    assert as_json["unserved"] == {"emails": 1}
    stats = project.run("stats", PGDRAIN_QUEUES="default")
    assert stats.out.splitlines()[-1] == (
        "not drained: 1 ready job in a queue outside PGDRAIN_QUEUES=default: emails (1 ready)"
    )
    assert _status(conn, email) == ("queued", 0)

    # Unrestricted, nothing is left, and nothing is said.
    assert "not drained" not in project.run("stats").out
    drained = project.run("drain")
    assert "not drained" not in drained.out and "claimed 1, done 1," in drained.out
    assert _status(conn, email) == ("done", 1)


# -- 2. unknown kinds and jobs modules that cannot be loaded -----------------------------------


def test_an_unknown_kind_is_refused_with_the_nearest_name_and_nothing_written(
    project: Project, conn: Conn
) -> None:
    typo = project.run("enqueue", "helo")
    assert (typo.code, typo.out) == (EXIT_BAD_INPUT, ""), typo
    assert only_line(typo.err) == (
        "pgdrain: error: no function is registered for job kind 'helo' in PGDRAIN_JOBS module "
        "'jobs' (did you mean 'hello'?); --unregistered enqueues it anyway"
    )
    # The README's `pgdrain enqueue noop --count 100`, against a module without `noop`.
    readme = project.run("enqueue", "noop", "--count", "100")
    assert readme.code == EXIT_BAD_INPUT and "'noop'" in only_line(readme.err), readme
    assert count_jobs(conn) == 0
    # On purpose, it goes in.
    assert "enqueued job" in project.run("enqueue", "helo", "--unregistered").out


@pytest.mark.parametrize(
    ("module", "fragment"),
    [
        ("def broken(:\n", "failed to import: SyntaxError"),
        ("import no_such_dependency_xyz\n", "No module named 'no_such_dependency_xyz'"),
        (None, "was not found"),
    ],
    ids=["syntax error", "import error", "no module"],
)
def test_enqueue_with_a_jobs_module_that_cannot_load_exits_2_and_writes_nothing(
    tmp_path: Path, db_url: str, conn: Conn, module: str | None, fragment: str
) -> None:
    project = _project(tmp_path, db_url, module or "")
    # No module: PGDRAIN_JOBS names one that is nowhere (not in the project's folder).
    env = {"PGDRAIN_JOBS": "team_jobs"} if module is None else {}
    for command in (["enqueue", "hello"], ["drain"]):  # as drain does
        run = project.run(*command, **env)
        assert run.code == EXIT_BAD_INPUT, run
        errors = [line for line in run.err.splitlines() if fragment in line]
        assert len(errors) == 1, run.err
    assert count_jobs(conn) == 0


def test_a_registry_without_kinds_makes_drain_exit_2_before_claiming(
    tmp_path: Path, db_url: str, conn: Conn
) -> None:
    project = _project(tmp_path, db_url, "from pgdrain import Registry\njobs = Registry()\n")
    job_id = _enqueued_id(project.run("enqueue", "hello", "--unregistered"))
    run = project.run("drain")
    assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), run
    assert "registers no job kinds" in only_line(run.err)
    assert _status(conn, job_id) == ("queued", 0)  # never claimed


def test_control_a_registry_without_this_kind_claims_the_job_and_fails_its_attempt(
    project: Project, conn: Conn
) -> None:
    """What the check spares: a drain whose registry lacks the kind spends an attempt of every
    job it claims (the jobs module above has kinds, none of them `hullo`)."""
    job_id = _enqueued_id(project.run("enqueue", "hullo", "--unregistered"))
    run = project.run("drain")
    assert run.code == EXIT_OK and "retried 1" in run.out, run
    assert _status(conn, job_id) == ("queued", 1)


# -- 3. an operator's cancel of a running job ---------------------------------------------------


def _heartbeats(conn: Conn, job_id: int, seen: set[Any], count: int) -> bool:
    row = conn.execute(
        "SELECT heartbeat_at FROM pgdrain.jobs WHERE id = %s AND status = 'running'", (job_id,)
    ).fetchone()
    if row is not None:
        seen.add(row[0])
    return len(seen) >= count


def test_an_operators_cancel_of_a_running_job_is_said_once_as_what_it_is(
    project: Project, conn: Conn, tmp_path: Path
) -> None:
    """Two jobs run; the operator cancels one. Its run says so in one line, and not again at
    each later heartbeat (three of them pass, counted on the other job's lease) nor when the
    cancelled job returns and its outcome is refused."""
    release = tmp_path / "release"
    payload = json.dumps({"release": str(release)})
    cancelled = _enqueued_id(project.run("enqueue", "until_released", "--payload", payload))
    other = _enqueued_id(project.run("enqueue", "until_released", "--payload", payload))
    drain = subprocess.Popen(
        [sys.executable, "-m", "pgdrain.cli", "drain", "--budget", "60"],
        cwd=project.folder,
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("PGDRAIN_")},
            **project.env(PGDRAIN_LEASE_SECONDS="1.5"),  # a heartbeat every 0.5 s
        },
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        both = "SELECT count(*) FROM pgdrain.jobs WHERE status = 'running'"
        wait_for(lambda: conn.execute(both).fetchone() == (2,), what="both jobs running")
        cancel = project.run("cancel", str(cancelled))
        assert (cancel.code, cancel.out.strip()) == (
            EXIT_OK,
            f"cancelled {cancelled} (was running): its run loses the lease, and its outcome "
            "will be refused",
        )
        beats: set[Any] = set()
        wait_for(lambda: _heartbeats(conn, other, beats, 5), what="four more heartbeats")
        release.write_text("go")
        out, err = drain.communicate(timeout=TIMEOUT_SECONDS)
    finally:
        release.write_text("go")
        if drain.poll() is None:
            drain.kill()
            drain.communicate()
    assert drain.returncode == EXIT_OK, err
    about = [line for line in err.splitlines() if str(cancelled) in line]
    assert len(about) == 1, err
    assert about[0].startswith(
        f"pgdrain: WARNING job {cancelled} cancelled by an operator: this attempt's outcome "
        "will not be recorded"
    ), err
    assert "lease lost: another attempt" not in err
    # Counted as cancelled, not as a lost lease (LeasesLost and its alarm stay quiet).
    assert "claimed 2, done 1, retried 0, failed 0, cancelled 1, lease lost 0," in out
    assert _status(conn, cancelled)[0] == "cancelled"


# -- 7. messages a user can act on -------------------------------------------------------------


BEFORE_MIGRATE = [
    ["stats"],
    ["jobs"],
    ["jobs", "show", "1"],
    ["enqueue", "hello", "--payload", '{"name": "x"}'],
    ["retry", "--failed"],
    ["cancel", "1"],
    ["purge", "--dry-run"],
]


def test_before_migrate_every_command_says_to_run_migrate(
    tmp_path: Path, empty_db_url: str
) -> None:
    project = _project(tmp_path, empty_db_url)
    for command in BEFORE_MIGRATE:
        run = project.run(*command)
        assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), (command, run)
        line = only_line(run.err)
        assert line.startswith("pgdrain: error: this database has no pgdrain schema"), line
        assert "run `pgdrain migrate`" in line, line
    drained = project.run("drain")
    assert drained.code == EXIT_BAD_INPUT, drained
    assert "run `pgdrain migrate`" in only_line(drained.out)  # the summary says why it stopped

    migrated = project.run("migrate")
    assert migrated.out.startswith("applied: 0001_init.sql, ")
    assert project.run("stats").code == EXIT_OK


def _migrate_before(url: str, version: str) -> None:
    """The schema an older pgdrain left: only the migrations before `version`."""
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        store.migration_lock(conn)
        for migration in migrations():
            if migration.version < version:
                store.migration_record(conn, migration)


def test_an_older_schema_says_to_run_migrate_for_a_missing_column_or_function(
    tmp_path: Path, empty_db_url: str
) -> None:
    """A red team's report: on a database an older pgdrain migrated, a column (stats, runs,
    retry) or a function (drain) a later migration adds was a raw database error, exit 1."""
    _migrate_before(empty_db_url, "0023")  # before run_history.cancelled and the lease floor
    project = _project(tmp_path, empty_db_url)
    for command in (["stats"], ["runs"], ["retry", "1"]):
        run = project.run(*command)
        assert (run.code, run.out) == (EXIT_BAD_INPUT, ""), (command, run)
        line = only_line(run.err)
        assert line.startswith("pgdrain: error: this database has no pgdrain schema"), line
        assert "run `pgdrain migrate`" in line, line
    drained = project.run("drain", "--budget", "5")
    assert drained.code == EXIT_BAD_INPUT, drained
    assert "run `pgdrain migrate` (function pgdrain." in only_line(drained.out)
    assert project.run("migrate").code == EXIT_OK
    assert project.run("stats").code == EXIT_OK


def test_a_database_that_does_not_exist_is_said_so_not_a_credentials_refusal(
    tmp_path: Path, db_url: str
) -> None:
    url = psycopg.conninfo.make_conninfo(db_url, dbname="no_such_db_wt_c")
    project = _project(tmp_path, url)
    for command in (["stats"], ["drain"]):
        run = project.run(*command)
        assert run.code == EXIT_BAD_INPUT, run
        text = run.out + run.err
        assert "'no_such_db_wt_c' does not exist" in text and "create it" in text, text
        assert "credentials" not in text


def test_a_budget_below_the_reserve_is_bad_input_not_an_empty_queue(
    project: Project, conn: Conn
) -> None:
    job_id = _enqueued_id(project.run("enqueue", "hello", "--payload", '{"name": "x"}'))
    short = project.run("drain", "--budget", "2")
    assert (short.code, short.out) == (EXIT_BAD_INPUT, ""), short
    assert only_line(short.err) == (
        "pgdrain: error: --budget 2 is not above the reserve (PGDRAIN_RESERVE_SECONDS=3), the "
        "time a run keeps to finish: nothing would be claimed; give more than 3 seconds"
    )
    assert _status(conn, job_id) == ("queued", 0)
    # Control: a budget above it drains.
    assert "done 1" in project.run("drain", "--budget", "4").out


def test_a_failed_attempt_is_one_short_line_and_its_traceback_is_kept(
    project: Project, conn: Conn
) -> None:
    job_id = _enqueued_id(project.run("enqueue", "boom"))

    drained = project.run("drain")

    line = only_line(drained.err)
    assert line.startswith(
        f"pgdrain: WARNING job will be retried: boom job {job_id}, attempt 1/5: "
        "ValueError: no such user: 42 (next attempt in "
    ), line
    assert len(line) < 160, line
    # The traceback is the job's: its frames, not the run's.
    shown = project.run("jobs", "show", str(job_id)).out
    assert "Traceback (most recent call last)" in shown
    assert 'jobs.py", line' in shown and 'raise ValueError("no such user: 42")' in shown
    assert f"{os.sep}pgdrain{os.sep}" not in shown, shown

    # With -v, it follows the line, indented.
    conn.execute("UPDATE pgdrain.jobs SET run_at = now() WHERE id = %s", (job_id,))
    verbose = project.run("-v", "drain")
    failure = [n for n, text in enumerate(verbose.err.splitlines()) if "will be retried" in text]
    assert len(failure) == 1, verbose.err
    after = verbose.err.splitlines()[failure[0] + 1 :]
    assert after[0] == "    Traceback (most recent call last):", verbose.err
    assert any('jobs.py", line' in text for text in after[:4]), verbose.err
    assert f"{os.sep}pgdrain{os.sep}" not in "\n".join(after[:4])


# -- 8. the everyday commands ----------------------------------------------------------------


def test_jobs_has_a_header_and_tells_ready_retrying_and_scheduled_apart(
    project: Project, conn: Conn
) -> None:
    retrying = _enqueued_id(project.run("enqueue", "boom"))
    assert "retried 1" in project.run("drain").out
    ready = _enqueued_id(project.run("enqueue", "hello", "--payload", '{"name": "x"}'))
    later = _enqueued_id(project.run("enqueue", "hello", "--delay", "600"))

    lines = project.run("jobs").out.splitlines()

    assert lines[0].split() == [
        "id", "queue", "kind", "state", "attempt", "reclaims", "last", "error",
    ]  # fmt: skip
    states = {int(line.split()[0]): line.split()[3:5] for line in lines[1:]}
    assert states[ready] == ["ready", "0/5"]
    assert states[retrying][0] == "retrying" and states[retrying][1] == "in"
    assert states[later] == ["scheduled", "in"]
    assert "in 10m" in lines[1]  # the newest first: the scheduled one
    as_json = {job["id"]: job["state"] for job in json.loads(project.run("jobs", "--json").out)}
    assert as_json == {ready: "ready", retrying: "retrying", later: "scheduled"}


def test_an_idle_queue_is_an_empty_result_not_an_error(project: Project) -> None:
    """A queue with no job right now (drained and purged, or only paused) is an empty result:
    a cron'd purge or a monitor's `jobs --json` of an idle queue exits 0."""
    project.run("enqueue", "send_email")
    assert project.run("drain", "--budget", "5").code == EXIT_OK
    purged = project.run("purge", "--queue", "emails", "--older-than-days", "0")
    assert purged.out.strip() == "deleted 1 finished job in queue 'emails'", purged
    project.run("pause", "reports")  # a queue known by its settings alone
    nothing: dict[tuple[str, ...], Callable[[Any], Any]] = {  # each --json, down to its "nothing"
        ("jobs",): lambda out: out,
        ("retry", "--failed"): lambda out: out["queued_again"],
        ("cancel", "--queued"): lambda out: out["cancelled"],
        ("purge",): lambda out: out["deleted"],
    }
    for queue in ("emails", "reports"):
        for command, read in nothing.items():
            run = project.run(*command, "--queue", queue, "--json")
            assert (run.code, run.err) == (EXIT_OK, ""), (command, queue, run)
            assert not read(json.loads(run.out)), (command, queue, run)
    again = project.run("purge", "--queue", "emails", "--older-than-days", "0")
    assert (again.code, again.out.strip()) == (EXIT_OK, "deleted 0 finished jobs in queue 'emails'")


def test_a_queue_the_database_does_not_know_gets_a_note_naming_the_nearest(
    project: Project,
) -> None:
    project.run("enqueue", "send_email")
    note = "pgdrain: note: no job, setting or kick names queue 'emial' (did you mean 'emails'?)"
    typo = project.run("jobs", "--queue", "emial")
    assert (typo.code, typo.out.splitlines()[1:]) == (EXIT_OK, ["(no jobs)"]), typo
    assert only_line(typo.err) == note
    as_json = project.run("jobs", "--queue", "emial", "--json")
    assert (as_json.code, json.loads(as_json.out), only_line(as_json.err)) == (EXIT_OK, [], note)
    for command in (["retry", "--failed"], ["cancel", "--queued"], ["purge", "--dry-run"]):
        run = project.run(*command, "--queue", "emial")
        assert (run.code, only_line(run.err)) == (EXIT_OK, note), (command, run)
    # Control: a name close to nothing known, and a known queue with nothing matching, are
    # empty results without a note.
    for queue, status in (("zzz", "queued"), ("emails", "failed")):
        empty = project.run("jobs", "--queue", queue, "--status", status)
        assert (empty.code, empty.err, empty.out.splitlines()[1:]) == (EXIT_OK, "", ["(no jobs)"])


def test_a_paused_typo_is_noted_and_a_drain_names_the_paused_queues(project: Project) -> None:
    """A red team's report: `pause emial` succeeded silently while emails ran on, and a drain
    with emails paused said "stopped: empty" with its job ready."""
    project.run("enqueue", "send_email")
    typo = project.run("pause", "emial")
    assert (typo.code, typo.out.split()[:2]) == (EXIT_OK, ["paused", "emial"]), typo
    assert only_line(typo.err) == (
        "pgdrain: note: no job, setting or kick names queue 'emial' (did you mean 'emails'?)"
    )
    known = project.run("pause", "emails")
    assert (known.code, known.err) == (EXIT_OK, ""), known
    paused_line = "paused: {} (no run claims their jobs; `pgdrain resume QUEUE`)"
    drained = project.run("drain", "--budget", "5")
    assert drained.out.splitlines()[0].startswith("claimed 0,"), drained
    assert drained.out.splitlines()[1:] == [paused_line.format("emails, emial")], drained
    # Control: resumed, its job runs, and only the typo is left paused.
    project.run("resume", "emails")
    drained = project.run("drain", "--budget", "5")
    assert drained.out.splitlines()[0].startswith("claimed 1,"), drained
    assert drained.out.splitlines()[1:] == [paused_line.format("emial")], drained


def test_cancel_is_safe_to_repeat_takes_a_filter_and_a_dry_run(
    project: Project, conn: Conn
) -> None:
    emails = [_enqueued_id(project.run("enqueue", "send_email")) for _ in range(2)]
    hello = _enqueued_id(project.run("enqueue", "hello", "--payload", '{"name": "x"}'))

    dry = project.run("cancel", "--queued", "--queue", "emails", "--dry-run")
    assert dry.code == EXIT_OK, dry
    assert dry.out.splitlines() == [
        "would cancel: 2 jobs",
        f"would cancel {emails[0]} emails send_email (was queued)",
        f"would cancel {emails[1]} emails send_email (was queued)",
    ]
    assert [_status(conn, i)[0] for i in emails] == ["queued", "queued"]

    done = json.loads(project.run("cancel", "--queued", "--queue", "emails", "--json").out)
    assert done == {
        "dry_run": False,
        "cancelled": [
            {"id": i, "queue": "emails", "kind": "send_email", "was": "queued"} for i in emails
        ],
        "already_finished": [],
        "unknown": [],
    }
    one = project.run("cancel", "--queued", "--kind", "hello")
    assert one.out.splitlines()[0] == "cancelled: 1 job"
    again = project.run("cancel", str(emails[0]), str(hello))
    assert (again.code, again.out.splitlines()) == (
        EXIT_OK,
        [
            f"job {emails[0]} is already cancelled: nothing to cancel",
            f"job {hello} is already cancelled: nothing to cancel",
        ],
    )


def test_retry_and_purge_speak_json(project: Project, conn: Conn) -> None:
    job_id = _enqueued_id(project.run("enqueue", "boom"))
    conn.execute(
        "UPDATE pgdrain.jobs SET status = 'failed', finished_at = now() - interval '9 days'"
        " WHERE id = %s",
        (job_id,),
    )
    dry = json.loads(project.run("retry", "--failed", "--dry-run", "--json").out)
    assert dry == {
        "dry_run": True,
        "queued_again": [job_id],
        "key_held": {},
        "dependency_ended": {},
        "not_queued_again": [],
        "already_pending": {},
        "waits_for_lease": {},
    }
    purge = json.loads(project.run("purge", "--dry-run", "--json").out)
    assert purge == {"dry_run": True, "deleted": 1, "older_than_days": 7.0, "queue": None}
    assert project.run("purge").out.strip() == "deleted 1 finished job"
    assert count_jobs(conn) == 0
