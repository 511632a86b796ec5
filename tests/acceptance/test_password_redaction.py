"""A password with an unencoded '@' (or '/') in DATABASE_URL: libpq ends the password at the
first '@' or '/' and takes the rest for the host (or the database name), which its connection
errors quote ("failed to resolve host 'TAIL@127.0.0.1'"). pgdrain refuses such a URL at start
(exit 2, one line, the text not shown), and connection.connect redacts the password from any
driver error, whatever the string came from. Checked on stderr, the Lambda's log lines and the
invocation's result."""

from __future__ import annotations

import io
import json
import logging
import os
from typing import Any

import psycopg
import pytest

from helpers.aws import FakeContext, aws_environment, log_records
from helpers.cli import EXIT_BAD_INPUT, only_line, run_pgdrain
from helpers.restartable_pg import free_port
from pgdrain.aws import run as lambda_run
from pgdrain.aws.secrets import conninfo_from_value
from pgdrain.budget import Budget
from pgdrain.db import connection
from pgdrain.errors import ConfigError, DatabaseMisconfigured, DatabaseUnavailable
from pgdrain.settings import ENV_VARIABLES, Settings, credentials_ambiguous

TAIL = "Zq9TailOfThePassword"
URLS = {
    "at": f"postgresql://app:s3cr@{TAIL}@127.0.0.1:5432/app",
    "slash": f"postgresql://app:s3cr/{TAIL}@127.0.0.1:5432/app",
    "two-hosts": f"postgres://app:s3cr@{TAIL}@h1,h2:5432/app",
}


@pytest.mark.parametrize("url", URLS.values(), ids=URLS.keys())
def test_the_cli_refuses_the_url_without_showing_it(url: str) -> None:
    run = run_pgdrain("drain", "--budget", "5", env={"DATABASE_URL": url})
    assert run.code == EXIT_BAD_INPUT, run
    assert run.out == ""
    line = only_line(run.err)
    assert "DATABASE_URL is malformed" in line and "unencoded '@' or '/'" in line, line
    assert TAIL not in run.err and "s3cr" not in run.err


def test_the_lambda_refuses_it_in_its_log_and_its_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """handler/app.py as Lambda runs it: the cold start finds the URL bad, and every
    invocation reports that line, in the result and in one ERROR log line, and connects to
    nothing. (`pgdrain invoke` refuses it before the handler runs: exit 2, as `drain`.)"""
    import app

    aws_environment(monkeypatch)
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", URLS["at"])
    buffer = io.StringIO()
    handler = app.logger.logger_handler
    assert isinstance(handler, logging.StreamHandler)
    previous = handler.setStream(buffer)
    library = logging.getLogger(app.logger.name)
    attached = handler in library.handlers
    if not attached:
        library.addHandler(handler)
    try:
        monkeypatch.setattr(app, "runtime", lambda_run.cold_start(os.environ))
        entry: Any = app.lambda_handler  # given the fake context that stands for Lambda's
        result = entry({"pgdrain": {"reason": "safety"}}, FakeContext(30.0))
    finally:
        handler.setStream(previous)
        if not attached:
            library.removeHandler(handler)
    assert result["ok"] is False and result["error_kind"] == "configuration"
    assert "unencoded '@' or '/'" in result["error"]
    errors = [r for r in log_records(buffer.getvalue()) if r["level"] == "ERROR"]
    assert errors and all("unencoded" in r["message"] for r in errors), errors
    assert TAIL not in buffer.getvalue() + json.dumps(result)
    invoked = run_pgdrain("invoke", env={"DATABASE_URL": URLS["at"]})
    assert invoked.code == EXIT_BAD_INPUT and TAIL not in invoked.out + invoked.err, invoked


def test_connect_redacts_the_password_from_the_drivers_error() -> None:
    """A connection string that did not pass through Settings (a caller's own): the error
    names the host libpq tried, the password's tail replaced."""
    url = f"postgresql://app:s3cr@{TAIL}@127.0.0.1:{free_port()}/app"
    with pytest.raises((DatabaseMisconfigured, DatabaseUnavailable)) as raised:
        connection.connect(url, Settings(connect_timeout=2.0), Budget.seconds(3.0))
    text = str(raised.value)
    assert TAIL not in text and "s3cr" not in text, text
    assert connection.REDACTED in text, text


def test_control_the_driver_quotes_the_tail() -> None:
    """The control: psycopg's own error for the same string holds the tail (libpq read it as
    the host), as pgdrain printed it before."""
    url = f"postgresql://app:s3cr@{TAIL}@127.0.0.1:{free_port()}/app"
    with pytest.raises(psycopg.OperationalError) as raised:
        psycopg.connect(url, connect_timeout=2)
    assert TAIL in str(raised.value)


def test_redact_keeps_the_rest_of_the_message() -> None:
    url = "postgresql://app:pass@word@db.example:5432/app"
    text = "failed to resolve host 'word@db.example': Name or service not known"
    assert connection.redact(text, url) == (
        "failed to resolve host '[redacted]@db.example': Name or service not known"
    )
    plain = "host=db.example user=app password=hunter22"
    assert connection.redact("hunter22 rejected for app", plain) == "[redacted] rejected for app"


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://app:s3cret@db.example/app",
        "postgresql://app:pa%40ss@db.example/app",  # encoded: fine
        "postgresql://app:pa?ss@db.example/app",  # libpq reads it whole
        "postgresql://app:pw@db.example/app?application_name=me@example",  # '@' in the query
        "postgresql://db.example/app",
        "host=db.example password=pa@ss/word",
    ],
)
def test_control_unambiguous_urls_pass(url: str) -> None:
    assert not credentials_ambiguous(url)
    assert Settings(database_url=url).database_url == url


@pytest.mark.parametrize("url", URLS.values(), ids=URLS.keys())
def test_settings_refuse_an_ambiguous_url(url: str) -> None:
    with pytest.raises(ConfigError, match="unencoded") as raised:
        Settings(database_url=url)
    assert TAIL not in str(raised.value)


def test_a_secret_password_with_an_at_sign_is_quoted_not_split() -> None:
    conninfo = conninfo_from_value(
        {"host": "db.example", "username": "app", "password": f"s3cr@{TAIL}/x", "dbname": "app"}
    )
    parsed = psycopg.conninfo.conninfo_to_dict(conninfo)
    assert (parsed["host"], parsed["password"]) == ("db.example", f"s3cr@{TAIL}/x")
