"""connection.connect tells a server that is not up yet (retried with jittered backoff inside the
budget) from settings that cannot work (refused at once, DatabaseMisconfigured), against real
servers: the shared test server, and a server of this module's own whose pg_hba.conf asks one
role for a password (the others trust local connections). Time is injected: the budget's clock
moves only when the injected sleep is called, so nothing here waits."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql

from helpers.cli import EXIT_BAD_INPUT, ROOT, only_line, run_pgdrain
from helpers.restartable_pg import RestartableServer, free_port
from pgdrain.budget import Budget
from pgdrain.db import connection
from pgdrain.errors import AuthenticationFailed, DatabaseMisconfigured, DatabaseUnavailable
from pgdrain.settings import Settings

SETTINGS = Settings(reserve_seconds=1.0, connect_timeout=2.0)
PASSWORD_ROLE = "pw_role"
PASSWORD = "correct-horse-battery"


class FakeTime:
    """A clock that only the injected sleep moves, and the waits it was asked for."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep: Callable[[int], None] = lambda n: None

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.on_sleep(len(self.sleeps))


def connect(url: str, fake: FakeTime, *, budget: float = 30.0, jitter: float = 0.5) -> object:
    return connection.connect(
        url,
        SETTINGS,
        Budget.seconds(budget, clock=fake.clock),
        sleep=fake.sleep,
        jitter=lambda: jitter,
    )


def _with(url: str, **changes: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params.update(changes)
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


# -- not up yet: retried inside the budget -------------------------------------------------------


def test_a_closed_port_is_retried_until_the_budget_with_jittered_backoff() -> None:
    fake = FakeTime()
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(DatabaseUnavailable, match="Connection refused") as raised:
        connect(url, fake, budget=10.0, jitter=0.5)
    assert not isinstance(raised.value, DatabaseMisconfigured)
    # half of a ceiling that doubles from 0.25 s up to 4 s, until budget - reserve runs out
    assert fake.sleeps == [0.125, 0.25, 0.5, 1.0, 2.0, 2.0, 2.0]
    assert f"after {len(fake.sleeps) + 1} attempt(s)" in str(raised.value)


def test_control_without_jitter_runs_started_together_knock_together() -> None:
    """Jitter off (the same factor for every run): two runs wait exactly as long as each other
    before every attempt, so a burst of functions meets a starting Neon compute all at once.
    With jitter, their waits differ."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/postgres"
    waits = []
    for factor in (1.0, 1.0):
        fake = FakeTime()
        with pytest.raises(DatabaseUnavailable):
            connect(url, fake, budget=6.0, jitter=factor)
        waits.append(fake.sleeps)
    assert waits[0] == waits[1]
    jittered = []
    for seed in (1, 2):
        fake = FakeTime()
        rng = random.Random(seed)
        with pytest.raises(DatabaseUnavailable):
            connection.connect(
                url,
                SETTINGS,
                Budget.seconds(6.0, clock=fake.clock),
                sleep=fake.sleep,
                jitter=rng.random,
            )
        jittered.append(fake.sleeps)
    assert jittered[0] != jittered[1]


# -- settings that cannot work: at once ----------------------------------------------------------


def test_an_unresolvable_host_fails_at_once(server_url: str) -> None:
    """Was: retried as an outage for the whole budget (4 min 48 s in one invoke)."""
    fake = FakeTime()
    with pytest.raises(DatabaseMisconfigured, match="failed to resolve host"):
        connect(_with(server_url, host="no-such-host.invalid", hostaddr=""), fake)
    assert fake.sleeps == []


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"sslmode": "bogus"}, "invalid sslmode value"),
        ({"port": "abc"}, 'invalid integer value "abc"'),
        ({"port": "99999"}, "invalid port number"),
        ({"sslmode": "require"}, "server does not support SSL"),
        ({"dbname": "no_such_database_xyz"}, "database 'no_such_database_xyz' does not exist"),
        ({"user": "no_such_role_xyz"}, 'role "no_such_role_xyz" does not exist'),
    ],
    ids=["sslmode", "port-text", "port-range", "ssl-required", "database", "role"],
)
def test_settings_that_cannot_work_fail_at_once(
    server_url: str, changes: dict[str, str], fragment: str
) -> None:
    host = str(psycopg.conninfo.conninfo_to_dict(server_url).get("host") or "")
    if (not host or host.startswith("/")) and changes.get("sslmode") == "require":
        pytest.skip("a Unix-socket server has no SSL to refuse (libpq ignores sslmode there)")
    fake = FakeTime()
    with pytest.raises(DatabaseMisconfigured, match=fragment) as raised:
        connect(_with(server_url, **changes), fake)
    assert fake.sleeps == []
    assert "\n" not in str(raised.value)


def test_a_server_without_tls_is_told_with_what_to_do(server_url: str) -> None:
    """A development server has no TLS and the template requires it: the one line says how to
    connect without it, beside libpq's own words."""
    host = str(psycopg.conninfo.conninfo_to_dict(server_url).get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip("a Unix-socket server has no SSL to refuse (libpq ignores sslmode there)")
    with pytest.raises(DatabaseMisconfigured) as raised:
        connect(_with(server_url, sslmode="require"), FakeTime())
    assert "server does not support SSL" in str(raised.value)
    assert "end the URL with ?sslmode=disable" in str(raised.value)


def test_a_database_that_does_not_exist_is_not_a_refusal_of_the_credentials(
    server_url: str,
) -> None:
    """The credentials were fine: the message says what is missing and what to do."""
    with pytest.raises(DatabaseMisconfigured) as raised:
        connect(_with(server_url, dbname="no_such_database_xyz"), FakeTime())
    assert not isinstance(raised.value, AuthenticationFailed)
    assert "credentials" not in str(raised.value)
    assert "create it" in str(raised.value) and "in DATABASE_URL" in str(raised.value)


def test_a_database_missing_from_a_secret_names_the_secret(server_url: str) -> None:
    """The connection came from the secret: the fix is its 'dbname', not DATABASE_URL."""
    settings = Settings(reserve_seconds=1.0, db_secret_arn="arn:aws:secretsmanager:x:1:secret:db")
    url = _with(server_url, dbname="no_such_database_xyz")
    with pytest.raises(DatabaseMisconfigured, match=r"in the secret's 'dbname'"):
        connection.connect(url, settings, Budget.seconds(30, clock=FakeTime().clock))


# -- a server that asks for a password, and one that is starting ---------------------------------


@pytest.fixture(scope="module")
def password_server() -> Iterator[RestartableServer]:
    with RestartableServer() as server:
        with psycopg.connect(server.url(), autocommit=True) as admin:
            admin.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                    sql.Identifier(PASSWORD_ROLE), sql.Literal(PASSWORD)
                )
            )
        hba = server.pgdata / "pg_hba.conf"
        rules = f"host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256\n"
        hba.write_text(rules + hba.read_text())
        server.restart()
        yield server


def test_a_wrong_password_fails_at_once_as_authentication(
    password_server: RestartableServer,
) -> None:
    fake = FakeTime()
    wrong = password_server.url(user=PASSWORD_ROLE, password="wrong-password")
    with pytest.raises(AuthenticationFailed, match="password authentication failed") as raised:
        connect(wrong, fake)
    assert isinstance(raised.value, DatabaseMisconfigured)  # exit 2 in the CLI
    assert fake.sleeps == [] and "wrong-password" not in str(raised.value)
    right = password_server.url(user=PASSWORD_ROLE, password=PASSWORD)
    with connect(right, FakeTime()) as conn:  # type: ignore[attr-defined]
        assert conn.execute("SELECT current_user").fetchone() == (PASSWORD_ROLE,)


def test_cli_drain_with_a_wrong_password_exits_2_with_one_line(
    password_server: RestartableServer,
) -> None:
    url = password_server.url(user=PASSWORD_ROLE, password="wrong-password")
    run = run_pgdrain(
        "drain",
        "--budget",
        "30",
        env={"DATABASE_URL": url, "PYTHONPATH": str(ROOT / "handler")},
    )
    assert run.code == EXIT_BAD_INPUT, run
    assert "password authentication failed" in only_line(run.out)
    assert "wrong-password" not in run.out + run.err and "Traceback" not in run.err
    assert "retrying" not in run.err


def test_cli_enqueue_to_an_unresolvable_host_exits_2_at_once() -> None:
    url = "postgresql://app:pw@no-such-host.invalid:5432/app"
    run = run_pgdrain("enqueue", "noop", env={"DATABASE_URL": url})
    assert run.code == EXIT_BAD_INPUT, run
    line = only_line(run.err)
    assert "cannot work: failed to resolve host" in line and "retrying" not in run.err


def test_a_server_that_is_starting_is_waited_for(password_server: RestartableServer) -> None:
    """The server is stopped; the second backoff starts it: the third attempt connects."""
    password_server.stop()
    fake = FakeTime()
    fake.on_sleep = lambda n: password_server.start() if n == 2 else None
    try:
        with connect(password_server.url(), fake, budget=30.0) as conn:  # type: ignore[attr-defined]
            assert conn.execute("SELECT 1").fetchone() == (1,)
        assert len(fake.sleeps) == 2
    finally:
        if not password_server.is_running():
            password_server.start()


def test_control_with_no_budget_left_for_a_retry_the_same_start_is_an_error(
    password_server: RestartableServer,
) -> None:
    """The same stopped server, with a budget that leaves no time for a retry: unavailable."""
    password_server.stop()
    try:
        with pytest.raises(DatabaseUnavailable, match="after 1 attempt"):
            connect(password_server.url(), FakeTime(), budget=SETTINGS.reserve_seconds)
    finally:
        password_server.start()


# -- the classifier, for the errors no local server produces -------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        pg_errors.CannotConnectNow("FATAL:  the database system is starting up"),
        pg_errors.TooManyConnections("FATAL:  sorry, too many clients already"),
        psycopg.OperationalError("connection failed: ERROR: failed to acquire permit to connect"),
        psycopg.OperationalError("connection failed: compute is starting, please retry"),
        psycopg.OperationalError("connection timeout expired"),
        psycopg.OperationalError(
            'failed to resolve host "x": Temporary failure in name resolution'
        ),
        psycopg.OperationalError("server closed the connection unexpectedly"),
    ],
    ids=["57P03", "53300", "neon-permit", "neon-compute", "timeout", "dns-again", "closed"],
)
def test_not_up_yet_errors_are_retried(error: psycopg.OperationalError) -> None:
    assert connection.is_not_up_yet(error) and not connection.is_misconfiguration(error)


@pytest.mark.parametrize(
    ("error", "missing"),
    [
        (pg_errors.UndefinedTable('relation "pgdrain.queue_floors" does not exist'), True),
        (pg_errors.UndefinedColumn('column "done_kept" does not exist'), True),
        (pg_errors.UndefinedFunction("function pgdrain.lease_floor_raise() does not exist"), True),
        (pg_errors.InvalidSchemaName('schema "pgdrain" does not exist'), True),
        # Controls: what no migration adds is not an older schema.
        (pg_errors.UndefinedFunction("operator does not exist: text = integer"), False),
        (pg_errors.UndefinedFunction("function lower(integer) does not exist"), False),
        (pg_errors.UndefinedTable('relation "orders" does not exist'), False),
    ],
    ids=["table", "column", "function", "schema", "operator", "other-function", "other-table"],
)
def test_an_object_a_migration_adds_says_to_run_migrate(
    error: psycopg.Error, missing: bool
) -> None:
    assert connection.is_schema_missing(error) is missing
    assert ("run `pgdrain migrate`" in connection.describe(error)) is missing


def test_the_test_servers_are_reachable_by_url(server_url: str) -> None:
    """Sanity: the fixtures' own URL connects at once (no sleep)."""
    fake = FakeTime()
    with connect(_with(server_url, dbname="postgres"), fake) as conn:  # type: ignore[attr-defined]
        assert conn.execute("SELECT 1").fetchone() == (1,)
    assert fake.sleeps == []


def test_cli_drain_to_an_unresolvable_host_exits_2_at_once() -> None:
    url = "postgresql://app:pw@no-such-host.invalid:5432/app"
    run = run_pgdrain("drain", "--budget", "30", env={"DATABASE_URL": url})
    assert "retrying" not in run.err and "failed to resolve host" in run.out
    assert run.code == EXIT_BAD_INPUT, run


class _Attempts:
    """psycopg's connect to addresses that hold the connection: each times out after the whole
    timeout (on the injected clock), one address after the other."""

    def __init__(self, fake: FakeTime, addresses: int) -> None:
        self.fake = fake
        self.addresses = addresses
        self.timeouts: list[int] = []

    def __call__(self, conninfo: str, **kwargs: object) -> object:
        timeout = kwargs["connect_timeout"]
        assert isinstance(timeout, int)
        self.timeouts.append(timeout)
        self.fake.now += timeout * self.addresses
        raise psycopg.OperationalError("connection timeout expired")


@pytest.mark.parametrize("hosts", [1, 2, 3])
def test_a_slow_connect_keeps_the_reserve_whatever_the_addresses(
    hosts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A red team's finding: each attempt got min(connect timeout, the budget), so it ate the
    reserve the run needs to report, and psycopg gives each address the host resolves to (or
    each host named) that whole timeout: two addresses that hold the connection ran a 10 s
    invocation for 18 s, into Lambda's timeout. Now the addresses share what the budget less
    the reserve leaves."""
    fake = FakeTime()
    attempts = _Attempts(fake, hosts)
    monkeypatch.setattr(psycopg.Connection, "connect", attempts)
    names = ",".join(["127.0.0.1"] * hosts)
    ports = ",".join(str(5432 + n) for n in range(hosts))
    url = f"host={names} port={ports} dbname=postgres user=postgres"
    settings = Settings(reserve_seconds=3.0, connect_timeout=20.0)
    budget = 10.0
    with pytest.raises(DatabaseUnavailable, match="timeout expired"):
        connection.connect(
            url, settings, Budget.seconds(budget, clock=fake.clock), sleep=fake.sleep
        )
    assert attempts.timeouts, "no attempt was made"
    assert fake.now <= budget - settings.reserve_seconds
