"""A leaner drain loop that exists only to put numbers on the profile's proposals. It is NOT
pgdrain and must not become it as is: no heartbeat, no budget or deadline, no retry of failed
jobs (they are left running), no reconnect.

It keeps pgdrain's shape: one autocommit connection that only the main thread uses, the very
statement the drain runs (job_complete_and_claim from queries.sql, fenced by the tokens the
claim returned), claims sized to the free slots of a pool of `concurrency` threads (refilled
once half of them are free, so no job waits claimed), one hand-off per job. What it leaves
out is the per-job bookkeeping the profile shows:

1. no frozen ClaimedJob/_Attempt/Held dataclasses and no threading.Event per job (one shared
   flag here; a real loop would keep the set of lost ids that the heartbeat fills and let
   `Job.lease_lost()` look there): a claimed row stays the tuple psycopg returned;
2. tokens and lease expiries stay text (uuid and timestamptz loaded as str), and the tokens go
   back as text[], which the statement's own `::uuid[]` casts: no UUID or datetime objects.

With claim_by_pk, the statement's claim UPDATE also finds its rows through the primary key
(`id = ANY(ARRAY(SELECT id FROM ready))`) instead of joining `ready`, which from about 100
rows on the planner does with a hash join over a sequential scan of the whole table.
"""

from __future__ import annotations

import threading
from queue import SimpleQueue
from typing import Any

import psycopg
from psycopg.types.string import TextLoader

from pgdrain.registry import Job, Registry, load_registry
from pgdrain.sql import query

Row = tuple[Any, ...]  # (completed, id, queue, kind, payload, attempts, max, token, lease)
Outcome = tuple[int, str, bool]  # id, token, succeeded

JOIN_READY = "    FROM ready\n    WHERE j.id = ready.id\n"
BY_PRIMARY_KEY = "    WHERE j.id = ANY(ARRAY(SELECT id FROM ready))\n"


def claim_by_pk(statement: str) -> str:
    """The same statement, its claim UPDATE reaching the claimed rows by primary key."""
    if JOIN_READY not in statement:
        raise ValueError("the claim no longer joins `ready` the way this rewrite expects")
    return statement.replace(JOIN_READY, BY_PRIMARY_KEY)


def _remaining() -> float:
    return 600.0


def _work(registry: Registry, tasks: SimpleQueue[Row | None], out: SimpleQueue[Outcome]) -> None:
    never_lost = threading.Event()
    while (row := tasks.get()) is not None:
        _, job_id, queue, kind, payload, attempt, max_attempts, token, _ = row
        try:
            registry.function_for(kind)(
                Job(
                    id=job_id,
                    kind=kind,
                    queue=queue,
                    payload=payload,
                    attempt=attempt,
                    max_attempts=max_attempts,
                    attempt_token=token,
                    _remaining=_remaining,
                    _lease_lost=never_lost,
                )
            )
        except Exception:
            out.put((job_id, token, False))
        else:
            out.put((job_id, token, True))


def drain_lean(
    url: str,
    batch: int,
    concurrency: int,
    queue_name: str = "default",
    by_pk: bool = False,
) -> int:
    """Drain `queue_name` until nothing is ready or running; returns the jobs completed."""
    registry = load_registry("jobs")
    tasks: SimpleQueue[Row | None] = SimpleQueue()
    outcomes: SimpleQueue[Outcome] = SimpleQueue()
    threads = [
        threading.Thread(target=_work, args=(registry, tasks, outcomes), daemon=True)
        for _ in range(concurrency)
    ]
    for thread in threads:
        thread.start()
    refill_at = max(1, min(concurrency, batch) // 2)
    statement: Any = query("job_complete_and_claim")
    if by_pk:
        statement = claim_by_pk(statement)
    params: dict[str, Any] = {
        "done_ids": [],
        "done_tokens": [],
        "queues": [queue_name],
        "limit": batch,
        "worker": "prototype",
        "lease_seconds": 30.0,
        "cap_seconds": 600.0,
        "claim_id": None,
    }
    done = running = 0
    finished_ids: list[int] = []
    finished_tokens: list[str] = []
    with psycopg.connect(url, autocommit=True, application_name="pgdrain-prototype") as conn:
        conn.adapters.register_loader("uuid", TextLoader)
        conn.adapters.register_loader("timestamptz", TextLoader)
        empty = False
        while True:
            wanted = min(concurrency - running, batch)
            if not empty and wanted > 0 and (running == 0 or wanted >= refill_at):
                params["done_ids"], params["done_tokens"] = finished_ids, finished_tokens
                params["limit"] = wanted
                finished_ids, finished_tokens = [], []
                rows = conn.execute(statement, params).fetchall()
                done += sum(1 for row in rows if row[0])
                claimed = [row for row in rows if not row[0]]
                empty = not claimed
                for row in claimed:
                    tasks.put(row)
                running += len(claimed)
            if running == 0:
                break
            outcome = outcomes.get()
            while True:
                running -= 1
                if outcome[2]:
                    finished_ids.append(outcome[0])
                    finished_tokens.append(outcome[1])
                if outcomes.empty():
                    break
                outcome = outcomes.get()
        if finished_ids:
            params["done_ids"], params["done_tokens"] = finished_ids, finished_tokens
            params["limit"] = 0
            done += sum(1 for row in conn.execute(statement, params).fetchall() if row[0])
    for _ in threads:
        tasks.put(None)
    return done
