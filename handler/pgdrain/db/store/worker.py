"""The statements of kicks by NOTIFY: the application's kick and the listening connection of
`pgdrain worker` (sql/worker.sql)."""

from __future__ import annotations

from pgdrain.db.sql import query
from pgdrain.db.store.common import Connection, one_statement


@one_statement
def kick_notify(conn: Connection, payload: str, listener: str) -> bool:
    """NOTIFY pgdrain_kick with `payload`, delivered when the statement's transaction commits;
    True when a connection named `listener` (a worker) is open on this database to hear it."""
    row = conn.execute(query("kick_notify"), {"payload": payload, "listener": listener}).fetchone()
    assert row is not None  # one row, from the one-row subquery
    return bool(row[0])


def kick_listen(conn: Connection) -> None:
    """LISTEN pgdrain_kick on this connection (autocommit: it takes effect at once)."""
    conn.execute(query("kick_listen"))
