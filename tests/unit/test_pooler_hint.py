"""A transaction pooler's host name with PGDRAIN_POOLER=session (the default) is said once: the
run's session settings and prepared statements would reach the pooler's other clients (a red
team's report, through PgBouncer: another client's queries ran with pgdrain's search_path)."""

from __future__ import annotations

import pytest

from pgdrain.db import connection
from pgdrain.settings import Settings

NEON = "postgresql://app@ep-cool-darkness-123456-pooler.us-east-2.aws.neon.tech/db"
PROXY = "host=mine.proxy-abc123xyz.eu-west-1.rds.amazonaws.com dbname=db"


@pytest.mark.parametrize(("url", "said"), [(NEON, True), (PROXY, True), ("host=db.local", False)])
@pytest.mark.parametrize("pooler", ["session", "transaction"])
def test_a_poolers_host_in_session_mode_is_said_once(
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    url: str,
    said: bool,
    pooler: str,
) -> None:
    monkeypatch.setattr(connection, "_warned_of_pooler", set())
    settings = Settings(pooler=pooler)  # type: ignore[arg-type]
    with caplog.at_level("WARNING", logger="pgdrain.db.connection"):
        for _ in range(2):
            connection.warn_of_a_pooler_in_session_mode(url, settings)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == (1 if said and pooler == "session" else 0), lines
    assert all("set PGDRAIN_POOLER=transaction" in line for line in lines)
