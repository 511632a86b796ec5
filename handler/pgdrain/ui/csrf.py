"""What makes a POST an operator's own: its Origin is the dashboard's, and it carries a token
the dashboard issued (an HMAC of when it was issued and to whom, under a secret key)."""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Callable, Collection
from urllib.parse import urlsplit

# A page's forms work for this long after it was served (a tab left open overnight needs a
# reload to act).
TOKEN_LIFETIME_SECONDS = 12 * 3600
# A token issued by a clock slightly ahead (another Lambda environment) is still accepted.
CLOCK_SKEW_SECONDS = 60


class Tokens:
    """Issue and check tokens. `key` is secret; every process serving the dashboard must
    share it for tokens to cross between them (Lambda: PGDRAIN_UI_SECRET)."""

    def __init__(self, key: bytes, clock: Callable[[], float] = time.time) -> None:
        if len(key) < 16:
            raise ValueError("the token key must be at least 16 bytes")
        self._key = key
        self._clock = clock

    def issue(self, identity: str) -> str:
        issued = str(int(self._clock()))
        return f"{issued}.{self._mac(issued, identity)}"

    def valid(self, token: str | None, identity: str) -> bool:
        if not token or token.count(".") != 1:
            return False
        issued, mac = token.split(".")
        if not (issued.isascii() and issued.isdigit()) or len(issued) > 12:
            return False
        age = self._clock() - int(issued)
        if not -CLOCK_SKEW_SECONDS <= age <= TOKEN_LIFETIME_SECONDS:
            return False
        return hmac.compare_digest(mac, self._mac(issued, identity))

    def _mac(self, issued: str, identity: str) -> str:
        message = f"pgdrain-ui\n{issued}\n{identity}".encode("utf-8", "backslashreplace")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()


def same_origin(origin: str | None, host: str | None, allowed: Collection[str] = ()) -> bool:
    """Whether a POST comes from a page of this dashboard: its Origin names the host it was
    sent to (scheme aside: a proxy may end TLS), or an origin allowed by configuration (a
    signing proxy that rewrites Host). No Origin, or `null`, is refused: browsers send one
    with every form POST."""
    if not origin or origin == "null" or not host:
        return False
    if origin.rstrip("/") in allowed:
        return True
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()
