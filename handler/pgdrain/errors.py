"""pgdrain's exceptions. Every error a user can cause derives from PgdrainError;
driver errors are translated into these in one place (pgdrain.db.connection)."""

from __future__ import annotations


class PgdrainError(Exception):
    """Base class: a problem pgdrain can describe in one line."""


class BadInput(PgdrainError):
    """An argument, payload, event or setting is invalid. Nothing was written. (Exit code 2.)"""


class ConfigError(BadInput):
    """An environment setting is invalid; the message names the variable."""


class JobsModuleNotFound(ConfigError):
    """PGDRAIN_JOBS names a module that is not on the Python path (as opposed to one that
    fails to import): `pgdrain enqueue` goes on without the kinds' options."""


class BadEvent(BadInput):
    """A Lambda event pgdrain does not understand; no database work was done."""


class DatabaseMisconfigured(ConfigError):
    """The connection settings cannot work (a bad sslmode or port value, a host name that does
    not resolve, a database or role that does not exist): retrying cannot help."""


class DatabaseUnavailable(PgdrainError):
    """The database could not be reached within the time budget."""


class AuthenticationFailed(DatabaseMisconfigured):
    """The database refused the credentials (a wrong password, an unknown role or database).
    Not retried; the Lambda reads its secret again once, in case it was rotated."""


class UnknownJobKind(BadInput):
    """A job kind has no registered function: refused at enqueue (Registry.enqueue, `pgdrain
    enqueue`); a claimed job of such a kind fails its attempt."""
