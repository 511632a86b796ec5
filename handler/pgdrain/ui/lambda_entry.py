"""The dashboard on AWS: a function behind a Function URL with AuthType AWS_IAM (template.yaml,
`WebDashboard=true`). Handler: `pgdrain.ui.lambda_entry.lambda_handler`.

PGDRAIN_UI_ACTIONS=true offers retry and cancel (its database role must allow them:
dashboard_role.sql); PGDRAIN_UI_SECRET_ARN names the secret that holds the key of the forms'
tokens, the same in every execution environment (the template generates one; PGDRAIN_UI_SECRET
gives the key itself, where the configuration is private); PGDRAIN_UI_ORIGINS lists origins
besides the Function URL's own whose POSTs are accepted (a signing proxy in front)."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
from collections.abc import Iterator, Mapping
from typing import Any

from aws_lambda_powertools.event_handler import LambdaFunctionUrlResolver

from pgdrain.aws.secrets import resolve_conninfo, secret_value
from pgdrain.budget import Budget
from pgdrain.db import connection, store
from pgdrain.errors import ConfigError, PgdrainError
from pgdrain.settings import Settings
from pgdrain.ui.app import UiConfig, build
from pgdrain.ui.csrf import Tokens

log = logging.getLogger(__name__)

ACTIONS_VARIABLE = "PGDRAIN_UI_ACTIONS"
SECRET_VARIABLE = "PGDRAIN_UI_SECRET"
SECRET_ARN_VARIABLE = "PGDRAIN_UI_SECRET_ARN"  # what the template sets: the key, read at start
ORIGINS_VARIABLE = "PGDRAIN_UI_ORIGINS"
MIN_SECRET_LENGTH = 32


def config_from_env(env: Mapping[str, str]) -> UiConfig:
    actions = env.get(ACTIONS_VARIABLE, "false").strip().lower()
    if actions not in ("true", "false"):
        raise ConfigError(f"{ACTIONS_VARIABLE} must be true or false, not {actions[:20]!r}")
    key = env.get(SECRET_VARIABLE, "")
    if env.get(SECRET_ARN_VARIABLE) and actions == "true":  # only forms need it
        # Read at cold start: a value in the environment is visible to whoever may read the
        # function's configuration (lambda:GetFunctionConfiguration), and could mint tokens.
        key = str(secret_value(env[SECRET_ARN_VARIABLE], SECRET_ARN_VARIABLE, env=env))
    if key and len(key) < MIN_SECRET_LENGTH:
        raise ConfigError(f"the forms' token key must be at least {MIN_SECRET_LENGTH} characters")
    if not key and actions == "true":
        # Each execution environment would draw its own: a form served by one is refused by
        # another. Said once per cold start; the actions still work within one environment.
        log.warning("%s is not set: a form may be refused by another environment", SECRET_VARIABLE)
    tokens = Tokens(key.encode() if key else secrets.token_bytes(32))
    origins = frozenset(
        o.strip().rstrip("/") for o in env.get(ORIGINS_VARIABLE, "").split(",") if o.strip()
    )
    return UiConfig(actions=actions == "true", tokens=tokens, origins=origins)


def _build(env: Mapping[str, str]) -> LambdaFunctionUrlResolver:
    settings = Settings.from_env(env)

    @contextlib.contextmanager
    def connect() -> Iterator[store.Connection]:
        # One connection per request, closed at its end: nothing stays open between requests
        # (a serverless database may suspend while nobody looks).
        conninfo = resolve_conninfo(settings)
        with connection.connect(
            conninfo, settings, Budget.seconds(settings.connect_timeout)
        ) as conn:
            store.operator_session(conn)
            yield conn

    return build(connect, config_from_env(env))


_app: LambdaFunctionUrlResolver | None = None


def lambda_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    global _app
    if _app is None:
        try:
            _app = _build(os.environ)
        except PgdrainError as exc:  # a bad setting, its secret unreadable: said, tried again
            log.error("the dashboard cannot start: %s", exc)
            return {
                "statusCode": 503,
                "headers": {"Content-Type": "text/plain; charset=utf-8"},
                "body": f"the dashboard cannot start: {exc}\n",
            }
    return _app.resolve(event, context)
