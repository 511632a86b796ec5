"""Database credentials from AWS Secrets Manager (PGDRAIN_DB_SECRET_ARN), read through
Powertools Parameters: cached for a few minutes, fetched again on demand (force_fetch) when the
database refuses them, as after a rotation. Nothing here logs or raises a secret's value."""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from typing import Any

from psycopg.conninfo import make_conninfo

from pgdrain.errors import ConfigError, DatabaseUnavailable
from pgdrain.settings import Settings

SECRET_MAX_AGE_SECONDS = 300  # Powertools' default cache age, stated
DEFAULT_PORT = 5432
DEFAULT_DBNAME = "postgres"
DB_SECRET_VARIABLE = "PGDRAIN_DB_SECRET_ARN"
SECRET_SHAPE = "an RDS secret: a JSON object with host, port, username, password, dbname"
_SECRET_ARN = re.compile(r"^arn:aws[a-z-]*:secretsmanager:([a-z0-9-]+):\d{12}:secret:.+")

# One Powertools SecretsProvider (its client and its value cache) per region, made on first use.
_providers: dict[str, Any] = {}
_providers_lock = threading.Lock()


def _provider(region: str) -> Any:
    from aws_lambda_powertools.utilities.parameters import SecretsProvider
    from botocore.config import Config

    with _providers_lock:
        if region not in _providers:
            _providers[region] = SecretsProvider(boto_config=Config(region_name=region))
        return _providers[region]


def clear_cache() -> None:
    """Forget the providers and the secrets they cached (tests, between mocked accounts)."""
    with _providers_lock:
        _providers.clear()


def secret_region(arn: str, env: Mapping[str, str], variable: str = DB_SECRET_VARIABLE) -> str:
    """The region of the secret: the ARN's own (a secret lives in one region, whatever
    AWS_REGION says), else AWS_REGION / AWS_DEFAULT_REGION for a secret given by name."""
    match = _SECRET_ARN.match(arn)
    if match:
        return match.group(1)
    region = env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION")
    if region:
        return region
    raise ConfigError(
        f"{variable} is not an ARN with a region "
        "(arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME) and AWS_REGION is not set"
    )


def secret_value(
    arn: str,
    variable: str,
    *,
    parse_json: bool = False,
    force_fetch: bool = False,
    env: Mapping[str, str] = os.environ,
) -> Any:
    """The value of the secret `arn` that the setting `variable` names (parsed as JSON or not),
    through Powertools' cache (boto3 is imported only here). Errors name the variable, never
    the value."""
    from aws_lambda_powertools.utilities.parameters.exceptions import (
        GetParameterError,
        TransformParameterError,
    )
    from botocore.exceptions import BotoCoreError

    region = secret_region(arn, env, variable)
    try:
        return _provider(region).get(
            arn,
            transform="json" if parse_json else None,
            force_fetch=force_fetch,
            max_age=SECRET_MAX_AGE_SECONDS,
        )
    except BotoCoreError as exc:  # no credentials, an unreachable endpoint: its class, one line
        raise DatabaseUnavailable(
            f"{variable}: could not read the secret: {type(exc).__name__}: {_first_line(exc)}"
        ) from None
    except TransformParameterError:
        raise ConfigError(f"{variable}: the secret is not JSON; expected {SECRET_SHAPE}") from None
    except GetParameterError as exc:
        raise DatabaseUnavailable(
            f"{variable}: could not read the secret: {_first_line(exc)}"
        ) from None


def conninfo_from_secret(
    arn: str, *, force_fetch: bool = False, env: Mapping[str, str] = os.environ
) -> str:
    """A libpq connection string built from the secret `arn`."""
    value = secret_value(arn, DB_SECRET_VARIABLE, parse_json=True, force_fetch=force_fetch, env=env)
    return conninfo_from_value(value)


def conninfo_from_value(value: object) -> str:
    """The connection string for an RDS-shaped secret value; ConfigError names what is missing
    (never what is there)."""
    if not isinstance(value, Mapping):
        raise ConfigError(f"PGDRAIN_DB_SECRET_ARN: the secret is not {SECRET_SHAPE}")
    host = _text(value, "host")
    user = _text(value, "username")
    password = _text(value, "password")
    dbname = value.get("dbname") or DEFAULT_DBNAME
    if not isinstance(dbname, str):
        raise ConfigError("PGDRAIN_DB_SECRET_ARN: the secret's 'dbname' is not a string")
    port = value.get("port", DEFAULT_PORT)
    if isinstance(port, str) and port.isdigit():
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
        raise ConfigError("PGDRAIN_DB_SECRET_ARN: the secret's 'port' is not a port number")
    return make_conninfo("", host=host, port=str(port), user=user, password=password, dbname=dbname)


_JSON_KINDS = {bool: "boolean", int: "number", float: "number", list: "array", dict: "object"}


def _text(value: Mapping[str, object], key: str) -> str:
    item = value.get(key)
    if item is not None and item != "" and not isinstance(item, str):
        # Its type only: the value may be the password.
        kind = _JSON_KINDS.get(type(item), "value")
        raise ConfigError(
            f"PGDRAIN_DB_SECRET_ARN: the secret's '{key}' is a JSON {kind}, not a string; "
            f"expected {SECRET_SHAPE}"
        )
    if not item:
        raise ConfigError(
            f"PGDRAIN_DB_SECRET_ARN: the secret has no '{key}'; expected {SECRET_SHAPE}"
        )
    return str(item)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def resolve_conninfo(settings: Settings, *, force_fetch: bool = False) -> str:
    """DATABASE_URL, else the connection string of the secret PGDRAIN_DB_SECRET_ARN."""
    if settings.database_url:
        return settings.database_url
    if settings.db_secret_arn:
        return conninfo_from_secret(settings.db_secret_arn, force_fetch=force_fetch)
    raise ConfigError("no database configured: set DATABASE_URL or PGDRAIN_DB_SECRET_ARN")
