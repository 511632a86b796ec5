"""The SQL ceiling: pgbench running exactly the statements pgdrain's drain runs per batch.

The statement text comes from pgdrain's own hot_path.sql. Numbers and arrays become pgbench
variables, constant strings literals. The claimed rows are folded into two arrays with
array_agg and carried by \\gset to the statement that completes them, which is thus fenced by
exactly the ids and tokens the claim returned, in a later statement and round trip, as the
drain does it. The statement is prepared on the server once per client and executed with each
variable once (`_bound_once`), as psycopg binds each named parameter once: pgbench's own
`-M prepared` binds every occurrence of a variable as a parameter of its own.

The shape, `complete-and-claim`: job_complete_and_claim completes the previous batch and
claims the next in one statement, one commit. pgbench variables live on from one transaction
to the next, so the ids and tokens a transaction claims are the ones the next one completes.
The first completes nothing (-D ids={}); each client claims its share of the jobs (a counter
variable), then runs one more transaction with limit 0 that only completes its last batch."""

from __future__ import annotations

import math
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import pgbench_path
from pgdrain.db.sql import PLACEHOLDER, query, query_names

# pgdrain's own values for a run: every queue (PGDRAIN_QUEUES unset, the default: the claim
# finds the queues itself), a 30 s lease, a lease cap well past the run.
PARAMS = {
    "queues": "NULL",  # a literal: pgbench variables are numbers
    "worker": "'pgbench'",  # a literal, like the worker id a run binds
    "limit": ":limit",
    "lease_seconds": ":lease_seconds",
    "cap_seconds": ":cap_seconds",
    "claim_id": "gen_random_uuid()",  # a run binds one uuid per claim
    "keep_done": "true",  # done jobs kept (PGDRAIN_RETAIN_DONE > 0, the default)
    # No position: every claim reads each queue from its start (a run's first claim).
    "position_queue": "NULL",
    "position_priority": "NULL",
    "position_run_at_us": "NULL",
    "position_id": "NULL",
    "ids": ":ids",
    "tokens": ":tokens",
    "done_ids": ":ids",
    "done_tokens": ":tokens",
}
# The planner settings the drain's connection keeps (hot_path.sql, session_limits): no JIT, no
# explicit sort where an index gives the order, every statement on its generic plan, planned
# once (the drain's since its connection keeps plan_cache_mode; the ceiling's since the cycle
# is prepared with its arrays as parameters, which a custom plan would plan at every batch).
PGOPTIONS = "-c jit=off -c enable_sort=off -c plan_cache_mode=force_generic_plan"
# :batch and :quota come from the command line (-D), like :ids, :tokens and :n.
SETS = "\\set lease_seconds 30\n\\set cap_seconds 600\n"
# complete-and-claim: claim `quota` batches, then one transaction that only completes.
COUNTER = "\\set n :n + 1\n\\set limit case when :n <= :quota then :batch else 0 end\n"
GSET = (
    "SELECT coalesce(array_agg(id), '{{}}') AS ids,\n"
    "       coalesce(array_agg(attempt_token), '{{}}') AS tokens\n"
    "FROM {rows}\n\\gset"
)


def shape() -> str:
    if "job_complete_and_claim" in query_names():
        return "complete-and-claim"
    raise RuntimeError("hot_path.sql has no job_complete_and_claim: the ceiling knows no other")


def _translate(name: str) -> str:
    def one(match: re.Match[str]) -> str:
        if match.group(1) not in PARAMS:
            raise KeyError(f"no pgbench value for {name}'s parameter %({match.group(1)})s")
        return PARAMS[match.group(1)]

    statement = PLACEHOLDER.sub(one, query(name))
    if "%(" in statement:
        raise ValueError(f"a parameter of {name} was left untranslated")
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))


def _wrap_result(statement: str, where: str) -> str:
    """Keep the statement's final SELECT (the first unindented one: the CTEs' are indented;
    it may be several joined by UNION ALL) as it is, as one more CTE, and return its claimed
    rows' ids and tokens as two arrays for \\gset."""
    cut = statement.index(where)
    head, tail = statement[:cut], statement[cut + 1 :]
    body = f"{head},\nresult_rows AS (\n{tail}\n)\n"
    return body


def claims_per_client(jobs: int, batch: int, clients: int) -> int:
    return math.ceil(jobs / (batch * clients))


def transactions_per_client(jobs: int, batch: int, clients: int) -> int:
    return claims_per_client(jobs, batch, clients) + 1  # the last completes only


def script() -> str:
    """The pgbench script: :batch jobs per claim, :quota claims per client (both defined on
    the command line)."""
    shape()  # refuses statements without the cycle
    cycle = _wrap_result(_translate("job_complete_and_claim"), "\nSELECT ")
    cycle += GSET.format(rows="result_rows WHERE NOT lost")
    return f"{SETS}{COUNTER}{_bound_once(cycle)}\n"


# The pgbench variables of the cycle, in the types the drain binds them as.
VARIABLE_TYPES = {
    "ids": "bigint[]",
    "tokens": "uuid[]",
    "limit": "int",
    "lease_seconds": "float8",
    "cap_seconds": "float8",
}
_VARIABLE = re.compile(r"(?<!:):([a-z_]+)\b")


def _bound_once(command: str) -> str:
    """The command as a statement prepared on the server once per client, executed with each
    pgbench variable once. pgbench binds every occurrence of a variable as a parameter of its
    own, in text: an array used three times was parsed three times (250 UUIDs each), where the
    drain binds each array once, in binary. Once per client: pgbench variables live on from
    one transaction to the next, `prepared` too."""
    sql, gset = command.rsplit("\n\\gset", 1)
    names = list(dict.fromkeys(_VARIABLE.findall(sql)))
    for n, name in enumerate(names, start=1):
        sql = re.sub(rf"(?<!:):{name}\b", f"${n}", sql)
    types = ", ".join(VARIABLE_TYPES[name] for name in names)
    # Sent as text (--protocol=simple: a utility statement takes no bound parameters), the
    # arrays quoted; their values, ids and UUIDs, hold no quote.
    arguments = ", ".join(
        f"':{name}'" if VARIABLE_TYPES[name].endswith("[]") else f":{name}" for name in names
    )
    return (
        "\\if :prepared = 0\n"
        f"PREPARE pgdrain_cycle({types}) AS\n{sql};\n"
        "\\set prepared 1\n"
        "\\endif\n"
        f"EXECUTE pgdrain_cycle({arguments})\n\\gset{gset}"
    )


def arguments(jobs: int, batch: int, clients: int) -> list[str]:
    """pgbench's options for draining `jobs` jobs with `clients` clients."""
    return [
        "--no-vacuum",
        "--protocol=simple",  # the cycle is PREPAREd on the server (_bound_once)
        f"--client={clients}",
        f"--jobs={clients}",
        f"--transactions={transactions_per_client(jobs, batch, clients)}",
        f"--define=batch={batch}",
        f"--define=quota={claims_per_client(jobs, batch, clients)}",
        "--define=ids={}",
        "--define=tokens={}",
        "--define=n=0",
        "--define=prepared=0",
    ]


@dataclass(frozen=True)
class PgbenchResult:
    tps: float
    transactions: int
    failed: int
    output: str


def run(url: str, jobs: int, batch: int, clients: int) -> PgbenchResult:
    """Drain `jobs` ready jobs with `clients` pgbench clients, `batch` jobs per claim."""
    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script())
        path = Path(handle.name)
    try:
        proc = subprocess.run(
            [pgbench_path(), *arguments(jobs, batch, clients), f"--file={path}", url],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
            env={**os.environ, "PGOPTIONS": PGOPTIONS},
        )
    finally:
        path.unlink()
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"pgbench failed ({proc.returncode}):\n{out}")
    tps = re.search(r"^tps = ([0-9.]+) \(without initial connection time\)", out, re.M)
    done = re.search(r"^number of transactions actually processed: (\d+)", out, re.M)
    failed = re.search(r"^number of failed transactions: (\d+)", out, re.M)
    if tps is None or done is None:
        raise RuntimeError(f"could not read pgbench's output:\n{out}")
    return PgbenchResult(
        tps=float(tps.group(1)),
        transactions=int(done.group(1)),
        failed=int(failed.group(1)) if failed else 0,
        output=out,
    )


def version() -> str:
    proc = subprocess.run([pgbench_path(), "--version"], capture_output=True, text=True)
    return proc.stdout.strip()
