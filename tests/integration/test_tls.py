"""TLS to the database: template.yaml's DatabaseSslMode (PGSSLMODE) defaults to `require`, which
never falls back to plaintext, and `verify-full` checks the server's certificate against the
system's trusted roots, for a DATABASE_URL and a secret's connection string alike.

A server of this module's own with ssl on (the machine's PostgreSQL binaries), its certificate
signed by a CA made here; the "system roots" are that CA's file through SSL_CERT_FILE (OpenSSL's
own override, read first by connection.system_roots), or the machine's real bundle, which does
not trust it."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from helpers.restartable_pg import free_port
from pgdrain.aws.secrets import conninfo_from_value
from pgdrain.budget import Budget
from pgdrain.db import connection
from pgdrain.errors import DatabaseMisconfigured
from pgdrain.settings import Settings

SETTINGS = Settings(reserve_seconds=1.0, connect_timeout=5.0)


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(folder: Path) -> Path:
    """A CA, and a certificate for 127.0.0.1 and localhost signed by it; returns the CA file."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
             "/CN=pgdrain test CA", "-keyout", "ca.key", "-out", "ca.crt", cwd=folder)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=localhost",
             "-keyout", "server.key", "-out", "server.csr", cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "2", "-extfile", "san.ext", "-out", "server.crt",
             cwd=folder)  # fmt: skip
    return folder / "ca.crt"


def _system_bin() -> Path | None:
    """The machine's PostgreSQL binaries (built with SSL, unlike the embedded ones)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


@pytest.fixture(scope="module")
def tls_server() -> Iterator[tuple[str, Path]]:
    """(a URL of a TLS server without any sslmode, the CA file that signed its certificate)."""
    bindir = _system_bin()
    if shutil.which("openssl") is None or bindir is None:
        pytest.skip("needs openssl and the machine's PostgreSQL binaries")
    user = "postgres" if os.geteuid() == 0 else None  # PostgreSQL refuses to run as root
    folder = Path(tempfile.mkdtemp(prefix="pgdrain-tls-"))
    pgdata, port = folder / "pgdata", free_port()
    try:
        ca = _certificates(folder)
        if user is not None:
            for path in (folder, *folder.iterdir()):
                shutil.chown(path, user, user)

        def run(*args: str) -> None:
            subprocess.run(args, check=True, capture_output=True, user=user, timeout=60)

        run(str(bindir / "initdb"), "-D", str(pgdata), "--auth=trust", "-U", "postgres")
        for name in ("server.crt", "server.key"):
            shutil.copy(folder / name, pgdata / name)
            (pgdata / name).chmod(0o600)
            if user is not None:
                shutil.chown(pgdata / name, user, user)
        options = (
            f"-c listen_addresses=127.0.0.1 -p {port} -c unix_socket_directories='' "
            "-c ssl=on -c fsync=off"
        )
        log = str(folder / "server.log")
        run(str(bindir / "pg_ctl"), "-D", str(pgdata), "-w", "-o", options, "-l", log, "start")
        try:
            yield f"postgresql://postgres@127.0.0.1:{port}/postgres", ca
        finally:
            run(str(bindir / "pg_ctl"), "-D", str(pgdata), "-w", "-m", "immediate", "stop")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _connect(url: str) -> psycopg.Connection[Any]:
    return connection.connect(url, SETTINGS, Budget.seconds(10.0))


def _ssl_in_use(conn: psycopg.Connection[Any]) -> bool:
    return bool(conn.pgconn.ssl_in_use)


def test_require_never_falls_back_to_plaintext(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared test server has no TLS: with PGSSLMODE=require the connection is refused at
    once (a setting that cannot work), for a DATABASE_URL and a secret's string alike."""
    params = psycopg.conninfo.conninfo_to_dict(db_url)
    if str(params.get("host", "")).startswith("/"):
        pytest.skip("a Unix-socket server has no TLS to refuse (libpq ignores sslmode there)")
    monkeypatch.setenv("PGSSLMODE", "require")
    secret = conninfo_from_value(
        {
            "host": params["host"],
            "port": params.get("port", 5432),
            "username": params["user"],
            "password": "unused",
            "dbname": params["dbname"],
        }
    )
    for url in (db_url, secret):
        with pytest.raises(DatabaseMisconfigured, match="server does not support SSL"):
            _connect(url)


def test_control_prefer_the_old_default_goes_plaintext(
    db_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with `prefer` (the template's default before) the same server is used
    without TLS, silently: credentials and job data in the clear."""
    monkeypatch.setenv("PGSSLMODE", "prefer")
    with _connect(db_url) as conn:
        assert not _ssl_in_use(conn)


def test_require_uses_tls(tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ca = tls_server
    monkeypatch.setenv("PGSSLMODE", "require")
    with _connect(url) as conn:
        assert _ssl_in_use(conn)


def test_verify_full_checks_the_certificate_against_the_system_roots(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The string names no sslrootcert: pgdrain passes the system's roots. The CA that signed
    the server's certificate is trusted: connected, verified. The machine's real roots do not
    trust it: refused (so the certificate is checked, not skipped)."""
    url, ca = tls_server
    params = psycopg.conninfo.conninfo_to_dict(url)
    secret = conninfo_from_value(
        {
            "host": "127.0.0.1",
            "port": int(str(params["port"])),
            "username": "postgres",
            "password": "unused",
            "dbname": "postgres",
        }
    )
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    assert connection.tls_kwargs(url) == {"sslrootcert": str(ca)}
    for conninfo in (url, secret):
        with _connect(conninfo) as conn:
            assert _ssl_in_use(conn)
    monkeypatch.delenv("SSL_CERT_FILE")
    assert connection.system_roots() != str(ca)
    with pytest.raises(DatabaseMisconfigured, match="certificate verify failed"):
        _connect(url)


def test_control_without_the_system_roots_verify_full_cannot_work(
    tls_server: tuple[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The control: libpq alone looks for ~/.postgresql/root.crt, which a function does not
    have, and refuses every connection with verify-full whatever the system trusts."""
    url, ca = tls_server
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    monkeypatch.delenv("PGSSLROOTCERT", raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(psycopg.OperationalError, match="root certificate file"):
        psycopg.connect(url, connect_timeout=5)
    assert os.environ["PGSSLMODE"] == "verify-full"


def test_the_strings_own_sslrootcert_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    assert connection.tls_kwargs("host=db sslrootcert=/my/ca.pem") == {}
    assert connection.tls_kwargs("host=db sslmode=require") == {}
    monkeypatch.setenv("PGSSLMODE", "require")
    assert connection.tls_kwargs("host=db") == {}
    assert "sslrootcert" in connection.tls_kwargs("host=db sslmode=verify-ca")
