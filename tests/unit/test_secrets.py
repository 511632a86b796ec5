"""pgdrain.aws.secrets: an RDS-shaped secret becomes a connection string; a wrong shape is named in
one line that never repeats the password."""

from __future__ import annotations

from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgdrain.aws.secrets import conninfo_from_value
from pgdrain.errors import ConfigError

PASSWORD = "p@ss w0rd'with\\quotes"
RDS_SECRET = {
    "engine": "postgres",
    "host": "db.cluster-abc.eu-west-1.rds.amazonaws.com",
    "port": 5432,
    "username": "drain",
    "password": PASSWORD,
    "dbname": "app",
    "dbClusterIdentifier": "db",
}


def test_an_rds_secret_becomes_a_connection_string() -> None:
    params = conninfo_to_dict(conninfo_from_value(RDS_SECRET))
    assert params == {
        "host": RDS_SECRET["host"],
        "port": "5432",
        "user": "drain",
        "password": PASSWORD,  # quoted by libpq's rules, so any character survives
        "dbname": "app",
    }


def test_port_and_dbname_have_defaults() -> None:
    secret = {k: v for k, v in RDS_SECRET.items() if k not in ("port", "dbname")}
    params = conninfo_to_dict(conninfo_from_value(secret))
    assert (params["port"], params["dbname"]) == ("5432", "postgres")
    assert conninfo_to_dict(conninfo_from_value({**RDS_SECRET, "port": "6432"}))["port"] == "6432"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("postgres://u:p@h/db", "the secret is not an RDS secret"),
        ([RDS_SECRET], "the secret is not an RDS secret"),
        ({**RDS_SECRET, "host": ""}, "the secret has no 'host'"),
        ({k: v for k, v in RDS_SECRET.items() if k != "username"}, "the secret has no 'username'"),
        ({**RDS_SECRET, "password": None}, "the secret has no 'password'"),
        ({**RDS_SECRET, "port": 0}, "'port' is not a port number"),
        ({**RDS_SECRET, "port": True}, "'port' is not a port number"),
        ({**RDS_SECRET, "dbname": 5}, "'dbname' is not a string"),
    ],
)
def test_a_wrong_shape_is_named_without_the_password(value: Any, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as raised:
        conninfo_from_value(value)
    assert PASSWORD not in str(raised.value)
    assert str(raised.value).startswith("PGDRAIN_DB_SECRET_ARN: ")
