"""Settings.from_env: the defaults, and every bad value refused at start with a message that
names the variable (no database)."""

from __future__ import annotations

import pytest

from pgdrain import settings as settings_module
from pgdrain.errors import BadInput, ConfigError
from pgdrain.settings import Settings, check_queue_name, parse_queues


def test_defaults_with_an_empty_environment() -> None:
    s = Settings.from_env({})
    assert s.database_url is None and s.db_secret_arn is None and s.function_name is None
    assert s.queues is settings_module.DEFAULT_QUEUES is None  # every queue
    assert s.jobs_module == "jobs"
    assert s.batch_size == settings_module.DEFAULT_BATCH_SIZE
    assert s.concurrency == settings_module.DEFAULT_CONCURRENCY
    assert s.lease_seconds == settings_module.DEFAULT_LEASE_SECONDS
    assert s.reserve_seconds == settings_module.DEFAULT_RESERVE_SECONDS
    assert s.pooler == "session"
    assert s.connect_timeout == settings_module.DEFAULT_CONNECT_TIMEOUT_SECONDS
    assert s.reclaim_limit == settings_module.DEFAULT_RECLAIM_LIMIT
    assert s.max_chain == settings_module.DEFAULT_MAX_CHAIN
    assert s.kick_debounce_seconds == settings_module.DEFAULT_KICK_DEBOUNCE_SECONDS


def test_blank_values_mean_the_default() -> None:
    blank = {name: "   " for name in settings_module.ENV_VARIABLES}
    assert Settings.from_env(blank) == Settings.from_env({})


def test_every_variable_is_read() -> None:
    s = Settings.from_env(
        {
            "DATABASE_URL": "postgresql://u:secret@db.example:5432/app",
            "PGDRAIN_DB_SECRET_ARN": "arn:aws:secretsmanager:eu-west-1:123:secret:db",
            "PGDRAIN_QUEUES": " emails , reports,emails ",
            "PGDRAIN_JOBS": "app.jobs",
            "PGDRAIN_BATCH_SIZE": "25",
            "PGDRAIN_CONCURRENCY": " 8 ",
            "PGDRAIN_LEASE_SECONDS": "45.5",
            "PGDRAIN_RESERVE_SECONDS": "0.5",
            "PGDRAIN_POOLER": "Transaction",
            "PGDRAIN_CONNECT_TIMEOUT": "15",
            "PGDRAIN_RECLAIM_LIMIT": "100",
            "PGDRAIN_MAX_CHAIN": "0",
            "PGDRAIN_KICK_DEBOUNCE_SECONDS": "0.5",
            "PGDRAIN_FUNCTION_NAME": "pgdrain-drain",
            "PGDRAIN_FANOUT_SECONDS": "0",
            "PGDRAIN_KICK": " Lambda ",
        }
    )
    assert s.database_url == "postgresql://u:secret@db.example:5432/app"
    assert s.db_secret_arn == "arn:aws:secretsmanager:eu-west-1:123:secret:db"
    assert s.queues == ("emails", "reports")  # trimmed, de-duplicated, in order
    assert (s.jobs_module, s.batch_size, s.concurrency) == ("app.jobs", 25, 8)
    assert (s.lease_seconds, s.reserve_seconds, s.pooler) == (45.5, 0.5, "transaction")
    assert (s.connect_timeout, s.reclaim_limit, s.max_chain) == (15.0, 100, 0)
    assert (s.kick_debounce_seconds, s.function_name) == (0.5, "pgdrain-drain")
    assert s.fanout_seconds == 0.0  # fan out only for work past the budget
    assert s.kick == "lambda"


def test_the_database_url_is_not_in_the_repr() -> None:
    s = Settings.from_env({"DATABASE_URL": "postgresql://u:hunter2@db/app"})
    assert "hunter2" not in repr(s)


BAD_VALUES = [
    ("PGDRAIN_BATCH_SIZE", "ten"),
    ("PGDRAIN_BATCH_SIZE", "1.5"),
    ("PGDRAIN_BATCH_SIZE", "0"),
    ("PGDRAIN_BATCH_SIZE", "1001"),
    ("PGDRAIN_CONCURRENCY", "0"),
    ("PGDRAIN_CONCURRENCY", "-4"),
    ("PGDRAIN_CONCURRENCY", "257"),
    ("PGDRAIN_LEASE_SECONDS", "soon"),
    ("PGDRAIN_LEASE_SECONDS", "0.5"),
    ("PGDRAIN_LEASE_SECONDS", "nan"),
    ("PGDRAIN_LEASE_SECONDS", "inf"),
    ("PGDRAIN_LEASE_SECONDS", "1e400"),
    ("PGDRAIN_LEASE_SECONDS", "86401"),
    ("PGDRAIN_RESERVE_SECONDS", "-1"),
    ("PGDRAIN_RESERVE_SECONDS", "0"),  # no reserve would claim until the hard kill
    ("PGDRAIN_RESERVE_SECONDS", "0.4"),
    ("PGDRAIN_RESERVE_SECONDS", "601"),
    ("PGDRAIN_POOLER", "statement"),
    ("PGDRAIN_POOLER", "pgbouncer"),
    ("PGDRAIN_CONNECT_TIMEOUT", "0"),
    ("PGDRAIN_CONNECT_TIMEOUT", "121"),
    ("PGDRAIN_CONNECT_TIMEOUT", "-inf"),
    ("PGDRAIN_RECLAIM_LIMIT", "0"),
    ("PGDRAIN_RECLAIM_LIMIT", "all"),
    ("PGDRAIN_MAX_CHAIN", "16"),
    ("PGDRAIN_MAX_CHAIN", "-1"),
    ("PGDRAIN_KICK_DEBOUNCE_SECONDS", "-0.1"),
    ("PGDRAIN_KICK_DEBOUNCE_SECONDS", "3601"),
    ("PGDRAIN_QUEUES", ","),
    ("PGDRAIN_QUEUES", "emails;DROP TABLE pgdrain.jobs"),
    ("PGDRAIN_QUEUES", "emails,'reports'"),
    ("PGDRAIN_JOBS", "1jobs"),
    ("PGDRAIN_JOBS", "jobs; import os"),
    ("PGDRAIN_JOBS", "app..jobs"),
    ("PGDRAIN_JOBS", "app/jobs"),
    ("PGDRAIN_RETAIN_DONE", "7d"),
    ("PGDRAIN_RETAIN_DONE", "-1"),
    ("PGDRAIN_RETAIN_DONE", "nan"),
    ("PGDRAIN_RETAIN_FAILED", "36501"),
    ("PGDRAIN_RETAIN_FAILED", "inf"),
    ("PGDRAIN_SCHEDULE_RATE", "hourly"),
    ("PGDRAIN_SCHEDULE_RATE", "60"),  # a unit is required: ScheduleRate always has one
    ("PGDRAIN_SCHEDULE_RATE", "1 week"),
    ("PGDRAIN_SCHEDULE_RATE", "-1 hour"),
    ("PGDRAIN_SCHEDULE_RATE", "0 minutes"),
    ("PGDRAIN_SCHEDULE_RATE", "367 days"),
    ("PGDRAIN_FANOUT_SECONDS", "-1"),
    ("PGDRAIN_FANOUT_SECONDS", "3601"),
    ("PGDRAIN_FANOUT_SECONDS", "soon"),
    ("PGDRAIN_KICK", "sqs"),
    ("PGDRAIN_KICK", "lambda"),  # with no PGDRAIN_FUNCTION_NAME to invoke
]


@pytest.mark.parametrize(
    ("variable", "value"),
    [pytest.param(v, x, id=f"{v}={x}") for v, x in BAD_VALUES],
)
def test_a_bad_value_names_its_variable(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({variable: value})
    message = str(refused.value)
    assert variable in message
    assert "\n" not in message
    assert isinstance(refused.value, BadInput)  # the CLI's exit 2


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1 hour", 3600),
        ("5 minutes", 300),
        ("1 minute", 60),
        ("2 Days", 172800),
        ("7.5 seconds", 7.5),
    ],
)
def test_the_schedule_rate_is_read_as_template_yaml_writes_it(text: str, seconds: float) -> None:
    assert Settings.from_env({"PGDRAIN_SCHEDULE_RATE": text}).schedule_rate_seconds == seconds
    assert Settings.from_env({}).schedule_rate_seconds is None  # no sliding safety net


def test_control_good_values_at_the_edges_are_accepted() -> None:
    s = Settings.from_env(
        {
            "PGDRAIN_BATCH_SIZE": "1000",
            "PGDRAIN_CONCURRENCY": "1",
            "PGDRAIN_LEASE_SECONDS": "1",
            "PGDRAIN_RESERVE_SECONDS": "600",
            "PGDRAIN_CONNECT_TIMEOUT": "0.5",
            "PGDRAIN_MAX_CHAIN": "15",
            "PGDRAIN_QUEUES": "emails,",
        }
    )
    assert (s.batch_size, s.concurrency, s.lease_seconds, s.max_chain) == (1000, 1, 1.0, 15)
    assert s.queues == ("emails",)


SQL_METACHARACTERS = [
    "emails'",
    'emails"',
    "emails;",
    "emails)",
    "emails%",
    "emails\\",
    "emails\x00",
    "emails /*",
    "emails\n",
    "a b",
    "*",
    "",
    "-emails",
    ".emails",
    "0emails",
    "é",
    "q" * 64,
]


@pytest.mark.parametrize("name", SQL_METACHARACTERS)
def test_queue_names_refuse_sql_metacharacters(name: str) -> None:
    with pytest.raises(ConfigError, match="PGDRAIN_QUEUES"):
        check_queue_name(name, "PGDRAIN_QUEUES")


@pytest.mark.parametrize("name", ["default", "emails", "Emails_2", "_private", "a.b-c", "q" * 63])
def test_control_plain_queue_names_pass(name: str) -> None:
    assert check_queue_name(name) == name
    assert parse_queues(name, "--queues") == (name,)


def test_a_trailing_double_dash_is_a_name_not_a_comment() -> None:
    """`-` is allowed inside a name; the name is always a bound parameter, never SQL text, so
    `emails--` cannot comment anything out. It is accepted, and stays one name."""
    assert parse_queues("emails--", "PGDRAIN_QUEUES") == ("emails--",)


def test_constructing_settings_directly_is_validated_too() -> None:
    with pytest.raises(ConfigError, match="PGDRAIN_BATCH_SIZE"):
        Settings(batch_size=0)
    with pytest.raises(ConfigError, match="PGDRAIN_QUEUES"):
        Settings(queues=())
    with pytest.raises(ConfigError, match="PGDRAIN_QUEUES"):
        Settings(queues=("ok", "not ok"))
    with pytest.raises(ConfigError, match="PGDRAIN_QUEUES"):
        Settings(queues=("emails\n",))  # `$` would match before a final newline
    with pytest.raises(ConfigError, match="PGDRAIN_JOBS"):
        Settings(jobs_module="jobs\n")


def test_retention_is_a_number_of_days_with_defaults() -> None:
    s = Settings.from_env({})
    assert (s.retain_done_days, s.retain_failed_days) == (7.0, 30.0)
    s = Settings.from_env({"PGDRAIN_RETAIN_DONE": "0.5", "PGDRAIN_RETAIN_FAILED": "0"})
    assert (s.retain_done_days, s.retain_failed_days) == (0.5, 0.0)
    s = Settings.from_env({"PGDRAIN_RETAIN_FAILED": "36500"})
    assert s.retain_failed_days == 36500.0


def test_a_run_is_restricted_to_at_most_as_many_queues_as_its_events_carry() -> None:
    """A red team's report: PGDRAIN_QUEUES naming 101 queues was accepted, and the function
    then refused its own continue and wake events (at most 100 queues): the backlog waited for
    the hourly safety net, the summary saying `continued: true`."""
    from pgdrain.aws import events

    hundred = ",".join(f"q{n}" for n in range(100))
    assert len(Settings.from_env({"PGDRAIN_QUEUES": hundred}).queues or ()) == 100
    event = {"pgdrain": {"reason": "continue", "chain": 1, "queues": hundred.split(",")}}
    assert events.parse(event, Settings.from_env({"PGDRAIN_QUEUES": hundred})).chain == 1
    with pytest.raises(ConfigError, match="names 101 queues; at most 100"):
        Settings.from_env({"PGDRAIN_QUEUES": hundred + ",q100"})
