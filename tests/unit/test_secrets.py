"""pgdrain.aws.secrets: an RDS-shaped secret becomes a connection string; a wrong shape is named in
one line that never repeats the password."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from pgdrain.aws.secrets import conninfo_from_secret, conninfo_from_value
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
        (
            {**RDS_SECRET, "password": 12345},
            "the secret's 'password' is a JSON number, not a string",
        ),
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


# -- the region of the secret (moto's Secrets Manager; no network) -----------------------------

OTHER_REGION = "eu-west-1"


@pytest.fixture
def no_region(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Fake credentials, and no AWS_REGION / AWS_DEFAULT_REGION (nor a profile giving one)."""
    from helpers.aws import aws_environment, mocked_aws

    aws_environment(monkeypatch)
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    with mocked_aws():
        yield


def _create_secret(region: str) -> str:
    import boto3

    client = boto3.client("secretsmanager", region_name=region)
    return str(client.create_secret(Name="db", SecretString=json.dumps(RDS_SECRET))["ARN"])


def test_the_region_comes_from_the_arn(no_region: None) -> None:
    """Was: botocore's NoRegionError, a traceback that printed the ARN."""
    arn = _create_secret(OTHER_REGION)
    assert conninfo_to_dict(conninfo_from_secret(arn))["host"] == RDS_SECRET["host"]


def test_the_arn_region_wins_over_aws_region(
    no_region: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A secret lives in one region: the ARN's, whatever region the function runs in."""
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    arn = _create_secret(OTHER_REGION)
    assert conninfo_to_dict(conninfo_from_secret(arn))["user"] == "drain"


def test_a_name_without_any_region_is_one_line(no_region: None) -> None:
    with pytest.raises(ConfigError) as raised:
        conninfo_from_secret("pgdrain/db-credentials")
    message = str(raised.value)
    assert message.startswith("PGDRAIN_DB_SECRET_ARN is not an ARN with a region")
    assert "pgdrain/db-credentials" not in message and "\n" not in message


def test_a_name_takes_aws_region(no_region: None, monkeypatch: pytest.MonkeyPatch) -> None:
    _create_secret(OTHER_REGION)
    monkeypatch.setenv("AWS_REGION", OTHER_REGION)
    assert conninfo_to_dict(conninfo_from_secret("db"))["dbname"] == "app"
