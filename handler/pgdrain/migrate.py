"""Apply pending schema migrations, in order, each recorded in pgdrain.migrations.

Two processes running this at the same moment serialise on a transaction-scoped advisory lock
(safe through a transaction pooler); the second finds nothing pending."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import psycopg

from pgdrain.sql import migrations, query


@dataclass(frozen=True)
class MigrateResult:
    applied: tuple[str, ...]
    already: tuple[str, ...]


def migrate(conn: psycopg.Connection[Any]) -> MigrateResult:
    pending_names: list[str] = []
    with conn.transaction():
        conn.execute(query("migration_lock"))
        row = conn.execute(query("migration_ledger_exists")).fetchone()
        done: set[str] = set()
        if row and row[0]:
            done = {r[0] for r in conn.execute(query("migration_applied")).fetchall()}
        for migration in migrations():
            if migration.version in done:
                continue
            # Migration files are our own packaged DDL, never input.
            conn.execute(migration.sql)
            conn.execute(query("migration_record"), {"version": migration.version})
            pending_names.append(migration.name)
    return MigrateResult(applied=tuple(pending_names), already=tuple(sorted(done)))
