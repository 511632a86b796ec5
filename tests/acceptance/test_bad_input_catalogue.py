"""The catalogue of bad input (docs/reliability.md): every bad input tried, each row of that
table backed by a test here. The expected outcome everywhere: one clear line naming the problem,
the documented exit code or result (0 ok, 1 failure, 2 bad input), nothing partially written,
no job lost or stuck, and the password in DATABASE_URL in no output or log.

CLI cases run the real command in a process of its own; events go to the Lambda handler."""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from helpers.aws import FakeContext, aws_environment, log_records
from helpers.cli import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_OK,
    ROOT,
    Run,
    count_jobs,
    only_line,
    run_pgdrain,
)
from helpers.fixtures import job_of_kind, job_row, wait_for
from helpers.restartable_pg import free_port
from pgdrain import BadInput, enqueue
from pgdrain.aws import run as lambda_run
from pgdrain.settings import ENV_VARIABLES

Conn = psycopg.Connection[Any]
HERE = Path(__file__).resolve().parent
PASSWORD = "Tr0ub4dor-s3cret-pw"  # the test servers trust local connections and ignore it
TEN_MB = 10 * 1024 * 1024


def run_cli(url: str, *args: str | bytes, stdin: bytes = b"", **env: str) -> Run:
    """`pgdrain ARGS` with DATABASE_URL=url, the catalogue's job kinds, no other PGDRAIN_*."""
    run = run_pgdrain(
        *args,
        env={
            "DATABASE_URL": url,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(HERE)]),
            "PGDRAIN_JOBS": "catalogue_jobs",
            "PGDRAIN_RESERVE_SECONDS": "0.5",
            **env,
        },
        stdin=stdin,
    )
    assert PASSWORD not in run.out + run.err, "the password leaked into the output"
    # pgdrain's own crash starts a line; a job's traceback is a logged field (traceback=...).
    assert not re.search(r"(?m)^Traceback \(most recent call last\)", run.err), run.err
    return run


def _with_password(url: str) -> str:
    params = psycopg.conninfo.conninfo_to_dict(url)
    params["password"] = PASSWORD
    return psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]


@pytest.fixture
def secret_url(db_url: str) -> str:
    """The test's database, with a password in the URL that must never be shown."""
    return _with_password(db_url)


def _assert_bad_input(run: Run, fragment: str) -> None:
    assert run.code == EXIT_BAD_INPUT, run
    assert run.out == ""
    line = only_line(run.err)
    assert line.startswith("pgdrain: error: ") and fragment in line, line


# -- CLI arguments and settings: exit 2, one line, nothing written -----------------------------

LONG = str(10**30)
DEEP_TEXT = "[" * 50_000 + "]" * 50_000  # 100 KB: under Linux's 128 KiB per argument


def nested(depth: int) -> Any:
    """A value `depth` lists deep, built without recursion."""
    value: Any = {}
    for _ in range(depth):
        value = [value]
    return value


BAD_CLI = {
    # arguments
    "payload-invalid-json": (["enqueue", "ok", "--payload", '{"a": '], {}, "not valid JSON"),
    "payload-nul-escape": (["enqueue", "ok", "--payload", '{"a": "\\u0000"}'], {}, "NUL"),
    "payload-non-utf8": (["enqueue", "ok", "--payload", b'{"a": "\xff"}'], {}, "UTF-8"),
    "kind-non-utf8": (["enqueue", b"caf\xe9"], {}, "UTF-8"),
    "kind-empty": (["enqueue", ""], {}, "non-empty"),
    # A kind --kind filters would refuse: no command could list or cancel its jobs by kind.
    "kind-control": (["enqueue", "send\temail", "--unregistered"], {}, "printable"),
    "queue-non-utf8": (["enqueue", "ok", "--queue", b"q\xff"], {}, "not a plain queue name"),
    "queue-sql": (
        ["enqueue", "ok", "--queue", "q'; DROP TABLE pgdrain.jobs; --"],
        {},
        "not a plain queue name",
    ),
    "drain-queues-sql": (["drain", "--queues", "a;DROP TABLE pgdrain.jobs"], {}, "--queues"),
    "drain-queues-empty": (["drain", "--queues", ""], {}, "--queues names no queue"),
    "drain-queues-commas": (["drain", "--queues", " , "], {}, "--queues names no queue"),
    "payload-deep": (["enqueue", "ok", "--payload", DEEP_TEXT], {}, "nests deeper than 64"),
    "payload-dev-zero": (["enqueue", "ok", "--payload", "@/dev/zero"], {}, "longer than that"),
    "payload-missing-file": (["enqueue", "ok", "--payload", "@/no/such.json"], {}, "No such file"),
    "count-times-payload": (
        ["enqueue", "ok", "--payload", '{"p": "' + "x" * 100_000 + '"}', "--count", "3000"],
        {},
        "the limit for one enqueue is 268435456",
    ),
    "count-zero": (["enqueue", "ok", "--count", "0"], {}, "at least 1"),
    "count-negative": (["enqueue", "ok", "--count", "-5"], {}, "at least 1"),
    "count-huge": (["enqueue", "ok", "--count", LONG], {}, "at most"),
    "count-too-many": (["enqueue", "ok", "--count", "5000000"], {}, "--count must be at most"),
    "count-not-a-number": (["enqueue", "ok", "--count", "ten"], {}, "not a whole number"),
    "delay-negative": (["enqueue", "ok", "--delay", "-1"], {}, "not negative"),
    "delay-nan": (["enqueue", "ok", "--delay", "nan"], {}, "finite"),
    "delay-infinite": (["enqueue", "ok", "--delay", "1e400"], {}, "finite"),
    "delay-huge": (["enqueue", "ok", "--delay", "1e300"], {}, "at most"),
    "priority-huge": (["enqueue", "ok", "--priority", LONG], {}, "priority must be from"),
    "max-attempts-zero": (["enqueue", "ok", "--max-attempts", "0"], {}, "max_attempts"),
    "max-attempts-huge": (["enqueue", "ok", "--max-attempts", LONG], {}, "max_attempts"),
    "key-with-count": (["enqueue", "ok", "--key", "k", "--count", "2"], {}, "--key"),
    "budget-negative": (["drain", "--budget", "-1"], {}, "not negative"),
    "budget-huge": (["drain", "--budget", "1e300"], {}, "at most"),
    "concurrency-huge": (["drain", "--concurrency", "100000"], {}, "from 1 to 256"),
    "retry-zero": (["retry", "0"], {}, "at least 1"),
    "retry-huge": (["retry", LONG], {}, "at most"),
    "jobs-limit-huge": (["jobs", "--limit", LONG], {}, "at most"),
    "purge-days-huge": (["purge", "--older-than-days", "1e6"], {}, "at most"),
    "unknown-command": (["explode"], {}, "invalid choice"),
    # settings, from the CLI's environment
    "batch-size-unparsable": (["drain"], {"PGDRAIN_BATCH_SIZE": "lots"}, "PGDRAIN_BATCH_SIZE"),
    "batch-size-out-of-range": (["drain"], {"PGDRAIN_BATCH_SIZE": "0"}, "PGDRAIN_BATCH_SIZE"),
    "lease-nan": (["drain"], {"PGDRAIN_LEASE_SECONDS": "nan"}, "PGDRAIN_LEASE_SECONDS"),
    "lease-out-of-range": (["drain"], {"PGDRAIN_LEASE_SECONDS": "0"}, "PGDRAIN_LEASE_SECONDS"),
    "reserve-out-of-range": (
        ["drain"],
        {"PGDRAIN_RESERVE_SECONDS": "1e9"},
        "PGDRAIN_RESERVE_SECONDS",
    ),
    "concurrency-negative": (["drain"], {"PGDRAIN_CONCURRENCY": "-1"}, "PGDRAIN_CONCURRENCY"),
    "pooler-unknown": (["drain"], {"PGDRAIN_POOLER": "statement"}, "PGDRAIN_POOLER"),
    "queues-sql": (["drain"], {"PGDRAIN_QUEUES": "a,b'--"}, "PGDRAIN_QUEUES"),
    "jobs-module-not-a-name": (["drain"], {"PGDRAIN_JOBS": "os; rm -rf /"}, "PGDRAIN_JOBS"),
    "jobs-module-missing": (["drain"], {"PGDRAIN_JOBS": "no_such_jobs_module"}, "no_such"),
    "database-url-malformed": (
        ["enqueue", "ok"],
        {"DATABASE_URL": f"postgresql://app:{PASSWORD}@[::1/db"},
        "DATABASE_URL is malformed",
    ),
    "database-host-unresolvable": (
        ["enqueue", "ok"],
        {"DATABASE_URL": f"postgresql://app:{PASSWORD}@no-such-host.invalid/app"},
        "cannot work: failed to resolve host",
    ),
    "database-sslmode-bogus": (
        ["enqueue", "ok"],
        {"DATABASE_URL": f"postgresql://app:{PASSWORD}@127.0.0.1/app?sslmode=bogus"},
        "cannot work: invalid sslmode value",
    ),
    "database-port-not-a-number": (
        ["stats"],
        {"DATABASE_URL": f"host=127.0.0.1 port=abc user=app password={PASSWORD}"},
        'cannot work: invalid integer value "abc" for connection option "port"',
    ),
    "database-url-not-a-url": (
        ["drain"],
        {"DATABASE_URL": f"host=localhost password {PASSWORD}"},
        "DATABASE_URL is malformed",
    ),
}


@pytest.fixture(scope="module")
def refusing_db(admin_url: str, template_db: str) -> Iterator[str]:
    """One migrated database for all the BAD_CLI cases: each must leave it empty."""
    name = f"pgdrain_bad_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(name), sql.Identifier(template_db)
            )
        )
    params = psycopg.conninfo.conninfo_to_dict(admin_url)
    params["dbname"] = name
    try:
        yield psycopg.conninfo.make_conninfo(**params)  # type: ignore[arg-type]
    finally:
        with psycopg.connect(admin_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


@pytest.mark.parametrize(("args", "env", "fragment"), BAD_CLI.values(), ids=BAD_CLI.keys())
def test_cli_bad_input(
    refusing_db: str, args: list[str | bytes], env: dict[str, str], fragment: str
) -> None:
    run = run_cli(_with_password(refusing_db), *args, stdin=b"", **env)  # env: variables alone
    _assert_bad_input(run, fragment)
    with psycopg.connect(refusing_db, autocommit=True) as conn:
        assert count_jobs(conn) == 0


def test_cli_a_10mb_payload_is_refused(secret_url: str, conn: Conn, tmp_path: Path) -> None:
    """As an argument, Linux refuses it (one argument is capped at 128 KiB: execve fails with
    E2BIG) and pgdrain never starts. From a file (@FILE) or standard input (@-), pgdrain's own
    limit (256 KiB) refuses it; so does enqueue() in the API. Nothing is written."""
    payload = '{"blob": "' + "x" * TEN_MB + '"}'
    with pytest.raises(OSError) as refused:
        run_cli(secret_url, "enqueue", "ok", "--payload", payload)
    assert refused.value.errno == errno.E2BIG
    big = tmp_path / "big.json"
    big.write_text(payload)
    _assert_bad_input(run_cli(secret_url, "enqueue", "ok", "--payload", f"@{big}"), "the limit")
    piped = run_cli(secret_url, "enqueue", "ok", "--payload", "@-", stdin=payload.encode())
    _assert_bad_input(piped, "the limit")
    binary = tmp_path / "latin1.json"
    binary.write_bytes(b'{"a": "caf\xe9"}')  # Latin-1, not UTF-8
    _assert_bad_input(run_cli(secret_url, "enqueue", "ok", "--payload", f"@{binary}"), "read")
    with pytest.raises(BadInput, match="the limit is"):
        enqueue(conn, "ok", {"blob": "x" * TEN_MB})
    assert count_jobs(conn) == 0


def test_cli_a_payload_file_is_measured_before_it_is_read(
    secret_url: str, conn: Conn, tmp_path: Path
) -> None:
    """A sparse 10 GiB file: its size is refused from stat alone (reading it whole was a
    MemoryError); a FIFO (size 0 to stat) fed more than the limit is cut off after limit + 1
    bytes."""
    huge = tmp_path / "huge.json"
    with huge.open("wb") as handle:
        handle.truncate(10 * 1024**3)
    run = run_cli(secret_url, "enqueue", "ok", "--payload", f"@{huge}")
    _assert_bad_input(run, "is 10737418240 bytes; the limit is 1048576 bytes of text")
    piped = run_cli(secret_url, "enqueue", "ok", "--payload", "@-", stdin=b" " * (3 * 1024**2))
    _assert_bad_input(piped, "@- is longer than that; the limit is 1048576")
    assert count_jobs(conn) == 0


def test_cli_invoke_event_not_utf8_deep_or_huge(
    secret_url: str, conn: Conn, tmp_path: Path
) -> None:
    """`pgdrain invoke -e FILE`: an event file of Latin-1 bytes, one nested 100,000 levels,
    and /dev/zero (endless: only Lambda's 6 MB limit is read) are each one line, exit 2."""
    latin1 = tmp_path / "latin1.json"
    latin1.write_bytes(b'{"pgdrain": {"reason": "caf\xe9"}}')
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    cases = {latin1: "is not UTF-8 text: byte 0xe9", deep: "nests deeper than 64"}
    cases[Path("/dev/zero")] = "larger than Lambda's limit"
    for path, fragment in cases.items():
        _assert_bad_input(run_cli(secret_url, "invoke", "-e", str(path)), fragment)
    piped = run_cli(secret_url, "invoke", "-e", "-", stdin=b'{"a": "\xff"}')
    _assert_bad_input(piped, "the event - is not UTF-8 text")
    env_json = tmp_path / "env.json"  # --env-vars: the same rules
    env_json.write_bytes(b'{"Parameters": {"PGDRAIN_QUEUES": "caf\xe9"}}')
    _assert_bad_input(run_cli(secret_url, "invoke", "-n", str(env_json)), "is not UTF-8 text")
    env_json.write_text('{"Parameters": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _assert_bad_input(run_cli(secret_url, "invoke", "-n", str(env_json)), "nests deeper than 64")
    assert count_jobs(conn) == 0


HUGE_INTEGER = '{"n": ' + "9" * 5_000 + "}"  # valid JSON; Python converts at most 4300 digits


def test_cli_an_integer_past_pythons_digit_limit_is_one_line(
    secret_url: str, conn: Conn, tmp_path: Path
) -> None:
    """A JSON integer of 5,000 digits in `enqueue --payload @FILE` and `invoke -e FILE` (each
    was a ValueError traceback, exit 1): one line, exit 2, nothing written. The scheduled
    event's `detail` string is BAD_EVENTS' `huge-integer-detail`."""
    payload = tmp_path / "payload.json"
    payload.write_text(HUGE_INTEGER)
    enqueued = run_cli(secret_url, "enqueue", "ok", "--payload", f"@{payload}")
    _assert_bad_input(enqueued, "--payload cannot be read: Exceeds the limit (4300")
    event = tmp_path / "event.json"
    event.write_text(
        '{"pgdrain": {"reason": "enqueue", "queues": ["default"], "n": 1' + "0" * 5_000 + "}}"
    )
    invoked = run_cli(secret_url, "invoke", "-e", str(event))
    _assert_bad_input(invoked, f"the event {event} cannot be read: Exceeds the limit (4300")
    assert count_jobs(conn) == 0


def test_api_a_deeply_nested_payload_is_refused(conn: Conn) -> None:
    """enqueue() measures the depth before json.dumps, which would raise RecursionError."""
    with pytest.raises(BadInput, match="payload nests deeper than 64 levels"):
        enqueue(conn, "ok", nested(100_000))
    enqueue(conn, "ok", nested(63))  # 64 levels with the innermost object: accepted
    assert count_jobs(conn) == 1


def test_cli_a_nul_byte_cannot_be_an_argument(secret_url: str, conn: Conn) -> None:
    """argv is NUL-terminated: the OS cannot pass one. Through the API, a kind with a NUL is
    refused (PostgreSQL text cannot hold it); a "\\u0000" escape in --payload is BAD_CLI's."""
    with pytest.raises(ValueError, match="null byte"):
        run_cli(secret_url, "enqueue", "ok\x00kind")
    with pytest.raises(BadInput, match="NUL"):
        enqueue(conn, "ok\x00kind")
    assert count_jobs(conn) == 0


def test_cli_sql_metacharacters_in_a_kind_or_key_are_only_text(secret_url: str, conn: Conn) -> None:
    """A kind may be any text: refused as unknown by the jobs module, and, enqueued anyway
    (--unregistered), stored as given (every value is a bound parameter); the drain retries it
    as an unknown kind, with a last_error naming it."""
    kind = "x'); DROP TABLE pgdrain.jobs; --"
    key = "k'; DELETE FROM pgdrain.jobs; --"
    refused = run_cli(secret_url, "enqueue", kind, "--key", key)
    assert refused.code == EXIT_BAD_INPUT and count_jobs(conn) == 0, refused
    run = run_cli(secret_url, "enqueue", kind, "--key", key, "--unregistered")
    assert run.code == EXIT_OK, run
    [row] = conn.execute("SELECT id, kind, idempotency_key FROM pgdrain.jobs").fetchall()
    assert (row[1], row[2]) == (kind, key)

    drained = run_cli(secret_url, "drain", "--budget", "30")
    assert drained.code == EXIT_OK, drained
    job = job_row(conn, row[0])
    assert (job["status"], job["attempts"]) == ("queued", 1)
    assert "no function is registered for job kind" in job["last_error"]


RAW_CONTROLS = ("\x1b", "\r", "\x07", "\u202e")


def test_cli_control_characters_from_job_data_are_escaped(secret_url: str, conn: Conn) -> None:
    """A job error text with ESC sequences, CR, LF, BEL and a right-to-left override, and a kind
    with an OSC title sequence: `drain` (its log lines) and `jobs` show them as escapes, one
    line per record, nothing acting on the terminal."""
    _enqueue_kind(conn, "explode_ansi", max_attempts=1)
    job_of_kind(conn, "\x1b]0;pwned\x07", max_attempts=1)  # enqueue refuses the kind
    drained = run_cli(secret_url, "-v", "drain", "--budget", "30")
    assert drained.code == EXIT_OK, drained
    listed = run_cli(secret_url, "jobs")
    assert listed.code == EXIT_OK, listed
    for text in (drained.out, drained.err, listed.out, listed.err):
        assert not any(c in text for c in RAW_CONTROLS), text
    assert "\\x1b[2J\\rgotcha\\n\\u202eevil\\x07" in listed.out, listed.out
    assert "\\x1b]0;pwned\\x07" in listed.out, listed.out
    assert len(listed.out.splitlines()) == 3, listed.out  # a header, and a line per job
    assert "job failed: \\x1b]0;pwned\\x07 job " in drained.err, drained.err
    # A record per line, its traceback (-v) on indented lines after it: no job text can make
    # a line that reads as a record of its own.
    lines = drained.err.splitlines()
    assert all(line.startswith(("pgdrain: ", "    ")) for line in lines), drained.err
    assert "    RuntimeError: \\x1b[2J" in lines, drained.err


HOSTILE_STR_SOURCE = """\
class Hostile(Exception):
    def __str__(self):
        raise RuntimeError("no text for you")


raise Hostile()
"""
EXITS_SOURCE = "import sys\n\nsys.exit(3)\n"
BROKEN_MODULES = {
    "syntax-error": ("def broken(:\n", "SyntaxError: "),
    "raises": ("raise RuntimeError('no config file')\n", "RuntimeError: no config file"),
    "missing-dependency": (
        "import no_such_dependency_xyz\n",
        "ModuleNotFoundError: No module named 'no_such_dependency_xyz'",
    ),
    # Hostile module code (were a traceback with exit 1, and a silent exit 3):
    "str-raises": (HOSTILE_STR_SOURCE, "Hostile: <str() raised RuntimeError>"),
    "exits-at-import": (EXITS_SOURCE, "SystemExit: 3"),
}


@pytest.mark.parametrize(("source", "fragment"), BROKEN_MODULES.values(), ids=BROKEN_MODULES.keys())
def test_a_job_module_that_fails_to_import(
    secret_url: str, conn: Conn, tmp_path: Path, source: str, fragment: str
) -> None:
    """PGDRAIN_JOBS names a module whose import fails: `drain` and `invoke` exit 2 with one line
    naming the module, the error and its file; the Lambda's cold start reports the same line
    for each invocation; nothing is claimed (they were tracebacks, or a claim of the queue)."""
    (tmp_path / "broken_jobs.py").write_text(source)
    job_id = _enqueue_kind(conn, "ok")
    path = os.pathsep.join([str(ROOT / "handler"), str(HERE), str(tmp_path)])
    expected = f"PGDRAIN_JOBS: module 'broken_jobs' failed to import: {fragment}"

    drained = run_cli(secret_url, "drain", PGDRAIN_JOBS="broken_jobs", PYTHONPATH=path)
    _assert_bad_input(drained, expected)
    assert "broken_jobs.py, line " in drained.err

    env_json = tmp_path / "env.json"
    env_json.write_text('{"Parameters": {"PGDRAIN_JOBS": "broken_jobs"}}')
    invoked = run_cli(secret_url, "invoke", "-n", str(env_json), PYTHONPATH=path)
    assert invoked.code == EXIT_BAD_INPUT, invoked
    result = invoked.result()
    assert result["ok"] is False and result["error"].startswith(expected), result
    assert result["error_kind"] == "configuration" and "\n" not in result["error"]

    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 0)


# The controls: the same modules with the mechanism off. safe_str replaced by str (what
# _import_failure called) in the real CLI; a bare import (what load_registry did with SystemExit,
# which `except Exception` does not catch).
SAFE_STR_OFF = (
    "import sys\n"
    "import pgdrain.api.registry\n"
    "pgdrain.api.registry.safe_str = str\n"
    "from pgdrain.cli import main\n"
    "sys.exit(main(['drain']))\n"
)
HOSTILE_CONTROLS = {
    "str-raises": (HOSTILE_STR_SOURCE, SAFE_STR_OFF, 1, "RuntimeError: no text for you"),
    "exits-at-import": (EXITS_SOURCE, "import broken_jobs\n", 3, ""),
}


@pytest.mark.parametrize(
    ("source", "script", "code", "shows"), HOSTILE_CONTROLS.values(), ids=HOSTILE_CONTROLS.keys()
)
def test_control_hostile_modules_with_the_mechanism_off(
    secret_url: str, tmp_path: Path, source: str, script: str, code: int, shows: str
) -> None:
    """Without safe_str the str-raises module ends `pgdrain drain` with a traceback (exit 1);
    without the SystemExit catch, the exits-at-import module ends the process silently with
    its own exit 3."""
    (tmp_path / "broken_jobs.py").write_text(source)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "DATABASE_URL": secret_url,
        "PGDRAIN_JOBS": "broken_jobs",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "handler"), str(tmp_path)]),
    }
    run = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode == code, run
    if shows:
        assert "Traceback (most recent call last)" in run.stderr and shows in run.stderr
    else:
        assert run.stderr == "", run.stderr


ESCAPES_SOURCE = 'raise RuntimeError("\\x1b]0;pwned\\x07\\x1b[2J")\n'


def test_a_job_module_error_holding_control_characters_is_escaped(
    secret_url: str, conn: Conn, tmp_path: Path
) -> None:
    """A job module whose import error holds an OSC title sequence, BEL and a clear-screen: the
    one `pgdrain: error:` line shows them as escapes (they reached the terminal raw). Control:
    the same error as `invoke` reports it in JSON holds the raw characters, so the text that
    reaches the CLI's last line does hold them and only the escaping keeps them off the
    terminal."""
    (tmp_path / "broken_jobs.py").write_text(ESCAPES_SOURCE)
    path = os.pathsep.join([str(ROOT / "handler"), str(HERE), str(tmp_path)])
    drained = run_cli(secret_url, "drain", PGDRAIN_JOBS="broken_jobs", PYTHONPATH=path)
    _assert_bad_input(drained, "RuntimeError: \\x1b]0;pwned\\x07\\x1b[2J (")
    assert not any(c in drained.err for c in RAW_CONTROLS), repr(drained.err)

    env_json = tmp_path / "env.json"
    env_json.write_text('{"Parameters": {"PGDRAIN_JOBS": "broken_jobs"}}')
    invoked = run_cli(secret_url, "invoke", "-n", str(env_json), PYTHONPATH=path)
    assert invoked.code == EXIT_BAD_INPUT, invoked
    assert not any(c in invoked.out + invoked.err for c in RAW_CONTROLS)  # JSON escapes them
    assert "RuntimeError: \x1b]0;pwned\x07\x1b[2J" in invoked.result()["error"]
    assert count_jobs(conn) == 0


def test_cli_drain_with_the_database_down_exits_1_with_one_error_line(conn: Conn) -> None:
    url = f"postgresql://app:{PASSWORD}@127.0.0.1:{free_port()}/nowhere"
    run = run_cli(url, "drain", "--budget", "3")
    assert run.code == EXIT_FAILURE, run
    errors = [line for line in run.err.splitlines() if "ERROR" in line]
    assert len(errors) == 1 and "database unreachable" in errors[0], run.err
    assert "stopped: error" in only_line(run.out)


# -- job functions that raise, hang past the deadline, or kill their process -------------------


def _enqueue_kind(conn: Conn, kind: str, **kwargs: Any) -> int:
    return enqueue(conn, kind, kwargs.pop("payload", {}), **kwargs)


def _wait_for_lease_end(conn: Conn, job_id: int) -> None:
    def ended() -> bool:
        row = conn.execute(
            "SELECT lease_expires_at < now() FROM pgdrain.jobs WHERE id = %s", (job_id,)
        ).fetchone()
        return bool(row and row[0])

    wait_for(ended, timeout=60, what=f"the lease of job {job_id} to end")


def test_job_that_raises_is_retried_with_its_error_recorded(secret_url: str, conn: Conn) -> None:
    job_id = _enqueue_kind(conn, "explode")
    run = run_cli(secret_url, "drain", "--budget", "30")
    assert run.code == EXIT_OK, run
    assert "retried 1" in run.out
    assert [line for line in run.err.splitlines() if "job will be retried" in line]
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"]) == ("queued", 1)
    assert row["last_error"] == "RuntimeError: boom on attempt 1"


def test_job_that_hangs_past_the_deadline_is_reclaimed_at_the_deadline(
    secret_url: str, conn: Conn
) -> None:
    job_id = _enqueue_kind(conn, "hang", payload={"on": [1]})
    run = run_cli(secret_url, "drain", "--budget", "3", "--json")
    assert run.code == EXIT_OK, run
    assert '"stop_reason": "budget"' in run.out and '"abandoned": 1' in run.out
    assert job_row(conn, job_id)["status"] == "running"
    _wait_for_lease_end(conn, job_id)  # the lease ended with the run's budget, not a lease later
    again = run_cli(secret_url, "drain", "--budget", "30", "--json")
    assert '"reclaimed": 1' in again.out and '"done": 1' in again.out, again
    row = job_row(conn, job_id)
    assert (row["status"], row["attempts"], row["reclaim_count"]) == ("done", 2, 1)


def test_job_that_kills_its_process_is_reclaimed_and_poison_ends_failed(
    secret_url: str, conn: Conn
) -> None:
    once = _enqueue_kind(conn, "suicide", payload={"on": [1]}, priority=1)
    poison = _enqueue_kind(conn, "suicide", max_attempts=2, priority=2)
    for _ in range(5):  # each run dies in the first of these jobs it starts
        run = run_cli(secret_url, "drain", "--budget", "3", "--concurrency", "1")
        if job_row(conn, poison)["status"] == "failed":
            break
        assert run.code == 9, run  # the job's own exit status: pgdrain never got to answer
        for job_id in (once, poison):
            if job_row(conn, job_id)["status"] == "running":
                _wait_for_lease_end(conn, job_id)
    assert job_row(conn, once)["status"] == "done"
    row = job_row(conn, poison)
    assert (row["status"], row["attempts"]) == ("failed", 2)
    assert "lease expired before completion (attempt 2 of 2" in row["last_error"]


# -- events: {"ok": false}, one ERROR line, no database work ----------------------------------

SCHEDULED = {"detail-type": "Scheduled Event", "source": "aws.events", "detail": {}}
BAD_EVENTS: dict[str, tuple[Any, str]] = {
    "not-a-dict-string": ("drain please", "not a JSON object"),
    "not-a-dict-list": ([{"pgdrain": {"reason": "enqueue"}}], "not a JSON object"),
    "not-a-dict-null": (None, "not a JSON object"),
    "not-a-dict-number": (42, "not a JSON object"),
    "empty": ({}, "unknown event"),
    "wrong-type-body": ({"pgdrain": "enqueue"}, "not an object"),
    "wrong-type-reason": ({"pgdrain": {"reason": 5, "queues": ["default"]}}, "'reason'"),
    "wrong-type-queues": ({"pgdrain": {"reason": "enqueue", "queues": "default"}}, "'queues'"),
    "wrong-type-queue": ({"pgdrain": {"reason": "enqueue", "queues": [7]}}, "not a string"),
    "wrong-type-chain": (
        {"pgdrain": {"reason": "continue", "queues": ["default"], "chain": "2"}},
        "'chain'",
    ),
    "unknown-reason": ({"pgdrain": {"reason": "explode", "queues": ["default"]}}, "explode"),
    "queue-sql": (
        {"pgdrain": {"reason": "enqueue", "queues": ["x'; DROP TABLE pgdrain.jobs;--"]}},
        "not a queue name",
    ),
    "oversized": ({**SCHEDULED, "detail": {"padding": "x" * 1_000_000}}, "bytes; the limit"),
    "deep": ({"pgdrain": nested(100_000)}, "the event nests deeper than 64 levels"),
    "deep-detail": (
        {**SCHEDULED, "detail": "[" * 5_000 + "]" * 5_000},
        "'detail' nests deeper than 64 levels",
    ),
    "huge-integer-detail": (  # past Python's 4300 digits: was a ValueError escaping parse
        {**SCHEDULED, "detail": HUGE_INTEGER},
        "scheduled event: 'detail' cannot be read: Exceeds the limit (4300 digits)",
    ),
}


@pytest.fixture
def handler(secret_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Any, io.StringIO]]:
    """handler/app.py as Lambda runs it, its log lines captured."""
    import app

    aws_environment(monkeypatch)
    for name in ENV_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DATABASE_URL", secret_url)
    monkeypatch.setattr(app, "runtime", lambda_run.cold_start(os.environ))
    buffer = io.StringIO()
    handler = app.logger.logger_handler
    assert isinstance(handler, logging.StreamHandler)
    previous = handler.setStream(buffer)
    # The logger app.py configured at import: a test that ran earlier may have taken the
    # handler off it again (tests/integration/test_lambda_handler.py's `logs` does).
    library = logging.getLogger(app.logger.name)
    attached = handler in library.handlers
    if not attached:
        library.addHandler(handler)
    try:
        yield app, buffer
    finally:
        handler.setStream(previous)
        if not attached:
            library.removeHandler(handler)


@pytest.mark.parametrize(("event", "fragment"), BAD_EVENTS.values(), ids=BAD_EVENTS.keys())
def test_bad_event(handler: tuple[Any, io.StringIO], conn: Conn, event: Any, fragment: str) -> None:
    app, logs = handler
    job_id = _enqueue_kind(conn, "ok")
    result = app.lambda_handler(event, FakeContext(30.0))
    assert result["ok"] is False and fragment in result["error"], result
    assert "\n" not in result["error"]
    errors = [r for r in log_records(logs.getvalue()) if r["level"] == "ERROR"]
    assert len(errors) == 1 and fragment in errors[0]["message"], errors
    assert PASSWORD not in logs.getvalue() + repr(result)
    row = job_row(conn, job_id)  # no database work: the job is untouched
    assert (row["status"], row["attempts"]) == ("queued", 0)
    assert count_jobs(conn) == 1
