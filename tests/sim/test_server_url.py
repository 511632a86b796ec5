"""The simulator's functions run with template.yaml's PGSSLMODE=require. Against a server without
TLS over TCP (DATABASE_URL set to a local server), every run failed to connect, and the traces
reported their jobs lost instead of the cause: the simulator's URL now says sslmode=disable."""

from __future__ import annotations

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from sim.run import _without_tls_when_the_server_has_none

pytestmark = pytest.mark.sim


def _server_has_tls(url: str) -> bool:
    with psycopg.connect(url) as conn:
        row = conn.execute("SHOW ssl").fetchone()
    return row is not None and row[0] == "on"


def _over_tcp(url: str) -> bool:
    return not str(conninfo_to_dict(url).get("host", "/")).startswith("/")


def test_the_functions_connect_with_the_templates_sslmode(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = _without_tls_when_the_server_has_none(db_url)
    refused_as_it_was = _over_tcp(db_url) and not _server_has_tls(db_url)
    monkeypatch.setenv("PGSSLMODE", "require")

    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    if refused_as_it_was:  # the control: the URL as it was (a Unix socket never uses TLS)
        with pytest.raises(psycopg.OperationalError, match="SSL"):
            psycopg.connect(db_url).close()


def test_a_url_that_names_its_sslmode_is_left_as_it_is(db_url: str) -> None:
    url = make_conninfo(db_url, sslmode="prefer")

    assert _without_tls_when_the_server_has_none(url) == url
