"""Login sessions of the feedback page: what the browser's cookie stands for.

The login form takes a gateway API key, but the cookie never holds it: a product
team's browser would otherwise carry a key that can send traffic, and logging out
could not take it back. The cookie holds a random session id (256 bits) instead.

Why a table in the feedback store rather than a signed token: the page runs as
several workers (``flywheel serve dashboard --workers N``), and a logout must end
the session in all of them at once; a signed token would need a shared secret *and*
a shared revocation list, while the table alone gives both. The id cannot be forged
or altered (the table is keyed by its SHA-256 digest, so an edited cookie is simply
unknown), nor read back from the store (only the digest is kept). Every request
looks the session up: it is refused once logged out (the row is deleted), once past
``expires_at`` (an absolute lifetime from the login, not renewed by use), and once
its key is gone from the key file (the row names the key by digest, and the key's
current lines are read from the file, never copied into the session).
"""

from __future__ import annotations

import hashlib
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, delete, insert, select

from dashboard.tables import dashboard_sessions_table
from gateway.keys import ApiKey

SESSION_ID_BYTES = 32
# What secrets.token_urlsafe(32) writes: anything else is refused before the store is asked.
_SESSION_ID = re.compile(r"^[A-Za-z0-9_-]{43}$")


def _utc_now() -> datetime:
    return datetime.now(UTC)


def session_digest(session_id: str) -> str:
    """The SHA-256 hex digest a session is stored and looked up by."""
    return hashlib.sha256(session_id.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class LoginSession:
    """A live login: the key it was opened with (by digest and name) and when it ends."""

    key_sha256: str
    key_name: str
    expires_at: datetime


class LoginSessions:
    """Sessions in the feedback store; ``clock`` is the time source (tests move it)."""

    def __init__(
        self,
        engine: Engine,
        lifetime: timedelta,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.engine = engine
        self.lifetime = lifetime
        self.clock = clock

    def open(self, key: ApiKey) -> str:
        """A new session for ``key``; returns its id, for the cookie (the store keeps only
        the digest). Expired sessions are deleted on the way, so the table stays small."""
        session_id = secrets.token_urlsafe(SESSION_ID_BYTES)
        now = self.clock()
        s = dashboard_sessions_table.c
        with self.engine.begin() as connection:
            connection.execute(delete(dashboard_sessions_table).where(s.expires_at <= now))
            connection.execute(
                insert(dashboard_sessions_table).values(
                    id_sha256=session_digest(session_id),
                    key_sha256=key.sha256,
                    key_name=key.name,
                    created_at=now,
                    expires_at=now + self.lifetime,
                )
            )
        return session_id

    def find(self, session_id: str | None) -> LoginSession | None:
        """The live session behind ``session_id``; None when it is malformed, unknown
        (never opened, altered, or logged out) or expired."""
        if not session_id or not _SESSION_ID.match(session_id):
            return None
        s = dashboard_sessions_table.c
        query = select(s.key_sha256, s.key_name, s.expires_at).where(
            s.id_sha256 == session_digest(session_id)
        )
        with self.engine.connect() as connection:
            row = connection.execute(query).first()
        if row is None or row.expires_at <= self.clock():
            return None
        return LoginSession(row.key_sha256, row.key_name, row.expires_at)

    def close(self, session_id: str | None) -> None:
        """End the session behind ``session_id`` for every worker (nothing when unknown)."""
        if not session_id or not _SESSION_ID.match(session_id):
            return
        s = dashboard_sessions_table.c
        with self.engine.begin() as connection:
            connection.execute(
                delete(dashboard_sessions_table).where(s.id_sha256 == session_digest(session_id))
            )
