"""Apply pending schema migrations, in order, each recorded in pgdrain.migrations.

Two processes running this at the same moment serialise on a transaction-scoped advisory lock
(safe through a transaction pooler); the second finds nothing pending."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgdrain import store
from pgdrain.sql import migrations


@dataclass(frozen=True)
class MigrateResult:
    applied: tuple[str, ...]
    already: tuple[str, ...]


def migrate(conn: psycopg.Connection[Any]) -> MigrateResult:
    pending_names: list[str] = []
    with conn.transaction():
        store.migration_lock(conn)
        done = store.migration_applied(conn)
        for migration in migrations():
            if migration.version not in done:
                store.migration_record(conn, migration)
                pending_names.append(migration.name)
    return MigrateResult(applied=tuple(pending_names), already=tuple(sorted(done)))
