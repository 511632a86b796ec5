"""A migration, once committed, is never edited: a database that applied it keeps what it
applied, and `pgdrain migrate` records only its version. An upgrade red team found databases
migrated with an early text of 0026 keeping a raise that locked other keys than 0030's
writers. A change is a new migration; migrations.sha256 holds each file's hash, and a new
migration adds its line there."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pgdrain.db.sql import Migration, migrations

LEDGER = Path(__file__).with_name("migrations.sha256")


def _hash(migration: Migration) -> str:
    return hashlib.sha256(migration.sql.encode("utf-8")).hexdigest()


def _changed(recorded: dict[str, str], found: list[Migration]) -> list[str]:
    """What differs from the recorded hashes: an edited or removed migration, one unrecorded."""
    now = {m.name: _hash(m) for m in found}
    problems = [
        f"{name}: edited (write a new migration)"
        for name in recorded
        if name in now and now[name] != recorded[name]
    ]
    problems += [f"{name}: removed" for name in recorded if name not in now]
    problems += [
        f"{name}: not in migrations.sha256 (add its line)" for name in now if name not in recorded
    ]
    return problems


def _recorded() -> dict[str, str]:
    lines = LEDGER.read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split("  ", 1) for line in lines if line)}


def test_no_committed_migration_is_edited() -> None:
    assert _changed(_recorded(), migrations()) == []


def test_control_an_edited_migration_is_found() -> None:
    found = migrations()
    edited = [*found[:-1], found[-1]._replace(sql=found[-1].sql + "\n-- changed\n")]
    assert _changed(_recorded(), edited) == [f"{found[-1].name}: edited (write a new migration)"]
