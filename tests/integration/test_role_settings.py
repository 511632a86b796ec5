"""A worker role can ALTER ROLE itself: PostgreSQL lets every role set its own session defaults
(`ALTER ROLE CURRENT_USER SET ...`), and they apply to every session it opens. A compromised job
holding the drain's credentials could so make the next runs fail: read-only transactions, a 1 ms
statement timeout, a serializable default, another DateStyle, IntervalStyle, TimeZone,
search_path or client_encoding. The run sets what it relies on itself, per transaction (behind a
transaction pooler) or per session (hot_path.sql's transaction_begin, transaction_limits and
session_limits; the client encoding in the startup packet), so each of these leaves a drain of
real jobs unharmed. The drains claim a few jobs at a time, so that claims start from the
run's positions (runner/positions.py): the claim's reply gives a position's run_at, and the
next claim sends it back, as microseconds since the epoch, which no setting changes and which
round-trips exactly (the keyset compares it with the rows' own).

The controls: the statements as they were (the lines marked `a role's own default` removed)
fail the drain under a read-only default; a connection of the role's own reads its payloads in
LATIN1 and fails on a job whose payload is not."""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Iterator, Mapping
from typing import Any, Literal, LiteralString

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

import jobs as example_jobs
from pgdrain import Budget, Settings, drain, enqueue, enqueue_many
from pgdrain.api.enqueue import build_job
from pgdrain.budget import FINAL_MARGIN_SECONDS as FINAL_MARGIN
from pgdrain.controls import Controls
from pgdrain.db import connection, store
from pgdrain.db import sql as statement_files
from pgdrain.db.session import Session
from pgdrain.runner.drain import drain_with

Conn = psycopg.Connection[Any]
GROUP = "pgdrain_worker"
PINNED = "a role's own default"
JOBS = 6
BATCH = 2  # so that a drain's later claims start from the positions its first ones left
HOSTILE = {  # the setting, and its value as ALTER ROLE ... SET writes it
    "read-only": ("default_transaction_read_only", "on"),
    "statement-timeout-1ms": ("statement_timeout", "1"),
    "lock-timeout-1ms": ("lock_timeout", "1"),
    "serializable": ("default_transaction_isolation", "serializable"),
    "idle-in-transaction-1ms": ("idle_in_transaction_session_timeout", "1"),
    "datestyle": ("DateStyle", "'SQL, DMY'"),
    "intervalstyle": ("IntervalStyle", "'sql_standard'"),
    "timezone-chatham": ("TimeZone", "'Pacific/Chatham'"),  # +12:45, +13:45 in summer
    "search-path": ("search_path", "public, pg_catalog"),
    "latin1": ("client_encoding", "LATIN1"),
}


def _as(url: str, user: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["user"] = user
    params.pop("password", None)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def worker_url(db_url: str, admin_url: str) -> Iterator[str]:
    """The test's database, as a fresh login role in pgdrain_worker (worker_role.sql)."""
    from importlib import resources

    role_sql = resources.files("pgdrain.db").joinpath("sql/worker_role.sql").read_text()
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute(role_sql)
    name = f"pgdrain_test_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE {}").format(
                sql.Identifier(name), sql.Identifier(GROUP)
            )
        )
    try:
        yield _as(db_url, name)
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def _set_own_default(worker_url: str, name: str, value: str) -> None:
    """As the worker itself: nothing but its own login is needed."""
    with psycopg.connect(worker_url, autocommit=True) as me:
        # The values are this module's own constants, written as SQL.
        me.execute(
            sql.SQL("ALTER ROLE CURRENT_USER SET {} = {}").format(
                sql.Identifier(name.lower()),
                sql.SQL(value),
            )
        )
    with psycopg.connect(worker_url, autocommit=True) as fresh:  # a new session has it
        row = fresh.execute(sql.SQL("SHOW {}").format(sql.Identifier(name.lower()))).fetchone()
        assert row is not None and value.strip("'")[:3].lower() in row[0].lower(), row


def _jobs(conn: Conn) -> None:
    for n in range(JOBS):
        enqueue(conn, "noop", {"n": n, "name": "名前"})  # not LATIN1


def _drain(worker_url: str, pooler: Literal["session", "transaction"]) -> Any:
    settings = Settings(reserve_seconds=0.5, lease_seconds=5, pooler=pooler, batch_size=BATCH)
    return drain(settings, Budget.seconds(20.0), example_jobs.jobs, worker_url)


def _done(conn: Conn) -> int:
    row = conn.execute("SELECT count(*) FROM pgdrain.jobs WHERE status = 'done'").fetchone()
    assert row is not None
    return int(row[0])


@pytest.fixture
def sent_positions(monkeypatch: pytest.MonkeyPatch) -> list[Mapping[str, store.ClaimPosition]]:
    """The positions each claim of the test's drains was sent with."""
    sent: list[Mapping[str, store.ClaimPosition]] = []
    make = store.job_complete_and_claim_statement

    def spy(*args: Any, **kwargs: Any) -> Any:
        sent.append(kwargs.get("positions") or {})
        return make(*args, **kwargs)

    monkeypatch.setattr(store, "job_complete_and_claim_statement", spy)
    return sent


@pytest.mark.parametrize("pooler", ["session", "transaction"])
@pytest.mark.parametrize(("name", "value"), HOSTILE.values(), ids=HOSTILE.keys())
def test_the_roles_own_defaults_do_not_reach_the_drain(
    worker_url: str,
    conn: Conn,
    sent_positions: list[Mapping[str, store.ClaimPosition]],
    name: str,
    value: str,
    pooler: Literal["session", "transaction"],
) -> None:
    _set_own_default(worker_url, name, value)
    _jobs(conn)
    result = _drain(worker_url, pooler)
    assert (result.stop_reason, result.error) == ("empty", None), result
    assert (result.done, _done(conn)) == (JOBS, JOBS)
    assert any(sent_positions), sent_positions  # a claim started from a position


@pytest.fixture
def first_limits_slow(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The first transaction's limits are slow to come (a statement before them sleeps 20 ms),
    as a loaded or resuming server's first statements can be: under the role's own 1 ms
    statement_timeout they are cancelled before they take effect. Returns how many
    transactions the sleep went out with (1)."""
    slowed: list[int] = []

    def slow_once(real: Any) -> Any:
        def limits(conn: Conn, timeout_ms: int) -> None:
            if not slowed:
                slowed.append(1)
                conn.execute("SELECT pg_catalog.pg_sleep(0.02)")
            real(conn, timeout_ms)

        return limits

    monkeypatch.setattr(store, "session_limits", slow_once(store.session_limits))
    monkeypatch.setattr(store, "transaction_limits", slow_once(store.transaction_limits))
    return slowed


@pytest.mark.parametrize("pooler", ["session", "transaction"])
@pytest.mark.parametrize("retry", [True, False], ids=["sent-again", "control-not-sent-again"])
def test_a_transaction_the_roles_timeout_cut_before_the_limits_is_sent_again(
    worker_url: str,
    conn: Conn,
    first_limits_slow: list[int],
    retry: bool,
    pooler: Literal["session", "transaction"],
) -> None:
    """The role's own statement_timeout (1 ms) applies to each transaction's BEGIN and limits,
    before the run's own limits take effect; a server slow there cancels them. The run sends
    that transaction again (nothing after the limits ran); the control gives up the run."""
    _set_own_default(worker_url, "statement_timeout", "1")
    _jobs(conn)
    controls = Controls(resend_a_transaction_cut_at_its_limits=retry)
    settings = Settings(reserve_seconds=0.5, lease_seconds=5, pooler=pooler, batch_size=BATCH)
    result = drain_with(controls, settings, Budget.seconds(20.0), example_jobs.jobs, worker_url)
    assert first_limits_slow == [1]
    if retry:
        assert (result.stop_reason, result.error) == ("empty", None), result
        assert (result.done, _done(conn)) == (JOBS, JOBS)
    else:
        assert result.stop_reason == "error" and result.error is not None, result
        assert "statement timeout" in result.error
        assert _done(conn) == 0


@store.one_statement
def _sleep(conn: Conn, seconds: float) -> None:
    # nextval is not undone by the cut: the sequence counts the times the server ran this.
    conn.execute("SELECT nextval('public.slept'), pg_catalog.pg_sleep(%(s)s)", {"s": seconds})


@pytest.mark.parametrize("pooler", ["session", "transaction"])
def test_a_statement_cut_at_the_runs_own_limit_is_not_sent_again(
    db_url: str, worker_url: str, pooler: Literal["session", "transaction"]
) -> None:
    """Only a cut at a transaction's BEGIN or limits is sent again: a statement that ran and
    outlasted the run's own limit is not (it may have done its work's part). Counted by the
    server, not by the log: on a loaded machine the role's 1 ms limit may also cut a limits
    statement, which is sent again, as it should be."""
    with psycopg.connect(db_url, autocommit=True) as owner:
        owner.execute("CREATE SEQUENCE public.slept")
        owner.execute(f"GRANT USAGE ON SEQUENCE public.slept TO {GROUP}")
    _set_own_default(worker_url, "statement_timeout", "1")
    session = Session(worker_url, Settings(pooler=pooler), Budget.seconds(FINAL_MARGIN + 0.3))
    session.open()
    try:
        with pytest.raises(psycopg.errors.QueryCanceled):
            session.run(_sleep, 5.0)
    finally:
        session.close()
    with psycopg.connect(db_url, autocommit=True) as owner:
        assert owner.execute("SELECT last_value FROM public.slept").fetchone() == (1,)


ODD = {  # every setting that changes how a time or an interval reads, at once
    "DateStyle": "'SQL, DMY'",
    "IntervalStyle": "'sql_standard'",
    "TimeZone": "'Pacific/Chatham'",
}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
US = dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    "at",
    [
        # the last microsecond of a second, the hour Chatham's clocks go back (+13:45 to +12:45)
        dt.datetime(
            2026, 4, 5, 2, 44, 59, 999_999, tzinfo=dt.timezone(dt.timedelta(hours=13, minutes=45))
        ),
        dt.datetime(2026, 1, 1, 0, 0, 0, 1, tzinfo=dt.UTC),  # the first microsecond of one
        dt.datetime(1969, 12, 31, 23, 59, 58, 500_001, tzinfo=dt.UTC),  # before the epoch
        # 2^53 microseconds before the epoch and more; Chatham's local mean time then, +12:13:48
        dt.datetime(1600, 3, 1, 12, 0, 0, 123_457, tzinfo=dt.UTC),
    ],
    ids=["chatham-dst-end", "second-start", "before-epoch", "past-2-53-us"],
)
def test_a_position_round_trips_exactly_under_a_roles_odd_settings(
    worker_url: str, conn: Conn, at: dt.datetime
) -> None:
    """On a connection that keeps the role's DateStyle, IntervalStyle and TimeZone (no limits
    sent), a claim gives each job's run_at as microseconds since the epoch, exactly, and a
    claim from a position at (0, at, E) takes what sorts after E and nothing else: F at the
    same run_at with a greater id, then H a microsecond later. A position a microsecond early
    would take E again, one a microsecond late would miss F."""
    for name, value in ODD.items():
        _set_own_default(worker_url, name, value)
    with conn.transaction():
        g, e, f, h = enqueue_many(
            conn, [build_job("noop", run_at=at + n * US) for n in (-1, 0, 0, 1)]
        )
    with psycopg.connect(worker_url, autocommit=True) as odd:
        row = odd.execute("SELECT current_setting('TimeZone')").fetchone()
        assert row == ("Pacific/Chatham",)
        with odd.transaction(force_rollback=True):
            claimed = _claim(odd, limit=4, positions={})
            exact = (at - EPOCH) // US
            assert [(j.id, j.run_at_us) for j in claimed] == [
                (g, exact - 1),
                (e, exact),
                (f, exact),
                (h, exact + 1),
            ]
        position = store.ClaimPosition(0, claimed[1].run_at_us, e)  # as the reply gave it
        with odd.transaction(force_rollback=True):
            after = _claim(odd, limit=2, positions={"default": position})
            assert [j.id for j in after] == [f, h]


def test_control_a_timestamptz_in_a_reply_cannot_be_read_under_the_roles_datestyle(
    worker_url: str, conn: Conn
) -> None:
    """Why the claim's reply gives a position's run_at as a bigint: the same run_at as a
    timestamptz, read on a connection that keeps the role's own DateStyle, fails."""
    _set_own_default(worker_url, "DateStyle", "'SQL, DMY'")
    _jobs(conn)
    with psycopg.connect(worker_url, autocommit=True) as plain:
        with pytest.raises(NotImplementedError, match="DateStyle"):  # psycopg's loader
            plain.execute("SELECT run_at FROM pgdrain.jobs LIMIT 1").fetchone()
        row = plain.execute(
            "SELECT (extract(epoch FROM run_at) * 1000000)::bigint FROM pgdrain.jobs LIMIT 1"
        ).fetchone()
        assert row is not None and isinstance(row[0], int)


# How the claim makes a position's run_at a timestamptz again, and the control's one product
# (as first proposed): a float8 holds every microsecond only within 2^53 of the epoch.
EXACT_RUN_AT = """'epoch'::timestamptz + (pos.run_at_us / 1000000) * interval '1 second'
               + mod(pos.run_at_us, 1000000) * interval '1 microsecond' AS after_run_at"""
ONE_PRODUCT = "'epoch'::timestamptz + pos.run_at_us * interval '1 microsecond' AS after_run_at"


def test_control_one_product_of_microseconds_misses_by_one_past_2_53(
    worker_url: str, conn: Conn
) -> None:
    """The same position, 2^53 microseconds and more before the epoch, made a timestamptz by
    one product: a microsecond off, so the claim from it takes E again, or misses F."""
    at = dt.datetime(1600, 3, 1, 12, 0, 0, 123_457, tzinfo=dt.UTC)
    with conn.transaction():
        _, e, f, h = enqueue_many(
            conn, [build_job("noop", run_at=at + n * US) for n in (-1, 0, 0, 1)]
        )
    position = store.ClaimPosition(0, (at - EPOCH) // US, e)
    with psycopg.connect(worker_url, autocommit=True) as plain:
        for decode, right in ((EXACT_RUN_AT, True), (ONE_PRODUCT, False)):
            with plain.transaction(force_rollback=True):
                after = _claim(plain, 2, {"default": position}, decode)
                assert ([j.id for j in after] == [f, h]) is right, (decode, after, e, f, h)


def _claim(
    odd: Conn,
    limit: int,
    positions: Mapping[str, store.ClaimPosition],
    decode: LiteralString = EXACT_RUN_AT,
) -> list[store.ClaimedJob]:
    statement = store.job_complete_and_claim_statement(
        [], ("default",), limit, "w", 30.0, None, None, positions=positions
    )
    assert statement.text.count(EXACT_RUN_AT) == 1
    text = statement.text.replace(EXACT_RUN_AT, decode)
    return store.Statement(text, statement.params, statement.read).run(odd)[1]


@pytest.mark.parametrize("pooler", ["session", "transaction"])
def test_control_the_statements_as_they_were_fail_under_a_read_only_default(
    worker_url: str,
    conn: Conn,
    monkeypatch: pytest.MonkeyPatch,
    pooler: Literal["session", "transaction"],
) -> None:
    loaded = statement_files.statements()
    old = {
        name: s._replace(text=without_lines(s.text, PINNED))
        for name, s in loaded.items()
        if name in ("transaction_begin", "transaction_limits", "session_limits")
    }
    assert all(PINNED not in s.text and s.text != loaded[n].text for n, s in old.items())
    monkeypatch.setattr(statement_files, "statements", lambda: {**loaded, **old})
    _set_own_default(worker_url, "default_transaction_read_only", "on")
    _jobs(conn)
    result = _drain(worker_url, pooler)
    assert result.stop_reason == "error", result
    assert "read-only transaction" in str(result.error), result
    assert _done(conn) == 0


def test_control_a_connection_of_the_roles_own_reads_in_its_encoding(
    worker_url: str, conn: Conn
) -> None:
    """A connection that does not name its client encoding gets the role's: LATIN1 cannot
    carry the payload, and the read fails. pgdrain's connection names UTF8."""
    _set_own_default(worker_url, "client_encoding", "LATIN1")
    _jobs(conn)
    statement = "SELECT payload::text FROM pgdrain.jobs LIMIT 1"
    with psycopg.connect(worker_url, autocommit=True) as plain:
        with pytest.raises(pg_errors.UntranslatableCharacter):
            plain.execute(statement).fetchone()
    with connection.connect(worker_url, Settings(), Budget.seconds(10.0)) as ours:
        row = ours.execute(statement).fetchone()
        assert row is not None and "名前" in row[0]


def without_lines(text: str, fragment: str) -> str:
    return "\n".join(line for line in text.splitlines() if fragment not in line)
