"""Who may see which business line: the gateway's API keys, reused as they are.

A key sees exactly the lines it may use on the gateway (``*`` sees all). It comes
as ``Authorization: Bearer <key>`` (API, scripts), or a browser logs in with it once
and then sends the session cookie the login form sets, which holds a session id, not
the key (:mod:`dashboard.sessions`). The key file is re-read when it changes, like
the gateway does, and checked on every request: a removed key ends its sessions.

Open mode, for local embedded use: when no key file exists, nobody has keys to
show, so the page is open, but only to clients on the loopback interface; any
other client gets 403 with the way out (``flywheel gateway add-key``).

A client that keeps presenting unknown keys is refused for a while (429 with
``Retry-After``, :mod:`dashboard.attempts`), and every form (the login and logout
forms too) is refused when posted from another site (:func:`check_same_origin`).
"""

from __future__ import annotations

import ipaddress
import shlex
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from starlette.requests import Request

from dashboard.attempts import FailedKeyAttempts, client_of
from dashboard.errors import PageError
from dashboard.sessions import LoginSessions
from gateway.keys import ApiKey, KeyFileWatch, KeyRing, bearer_token

COOKIE = "flywheel_session"


def login_commands(home: Path, name: str = "me") -> tuple[str, str]:
    """The shell commands that open the feedback page on the flywheel home ``home``, as
    the demo prints them: one makes a key that sees and reviews every line (printed once),
    the other serves the page. Both name the home: a key made elsewhere does not log in."""
    where = f"FLYWHEEL_HOME={shlex.quote(str(home))}"
    return (
        f"{where} .venv/bin/flywheel gateway add-key {name} --lines '*' --review-lines '*'",
        f"{where} .venv/bin/flywheel serve dashboard",
    )


@dataclass(frozen=True, slots=True)
class Viewer:
    """The caller: a key's name and the lines it may see (``open_mode``: no keys exist)."""

    name: str
    key: ApiKey | None
    open_mode: bool = False

    def may_see(self, business_line: str) -> bool:
        """Whether this caller may see ``business_line``."""
        return self.open_mode or (self.key is not None and self.key.may_use(business_line))

    def lines_among(self, known: Collection[str]) -> list[str]:
        """The known lines this caller may see, sorted."""
        return sorted(line for line in known if self.may_see(line))


@dataclass(frozen=True, slots=True)
class Login:
    """A login the form accepted: the key, and the session id and lifetime of its cookie."""

    key: ApiKey
    session_id: str
    max_age_s: int


def is_loopback(host: str | None) -> bool:
    """Whether a client address is on the loopback interface."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_loopback
    except ValueError:
        return host == "localhost"


def check_same_origin(request: Request, what: str) -> None:
    """403 for a form posted from another site: an ``Origin`` other than this page's, or a
    browser's ``Sec-Fetch-Site`` other than same-origin. ``Origin: null`` alone passes: this
    page's own forms send it (its no-referrer policy), and the other site's null (a
    sandboxed frame) comes with ``Sec-Fetch-Site: cross-site``. Scripts send neither."""
    origin = request.headers.get("origin")
    if origin and origin != "null":
        own = f"{request.url.scheme}://{request.url.netloc}"
        if origin.rstrip("/") != own:
            raise PageError(403, f"{what} may only be posted from this page, not {origin}")
    site = request.headers.get("sec-fetch-site")
    if site is not None and site not in ("same-origin", "none"):
        raise PageError(403, f"{what} may only be posted from this page, not a {site} one")


class Gatekeeper:
    """Turns a request's key (header) or session (cookie) into a :class:`Viewer`, or
    refuses it; opens and ends the sessions (none without ``sessions``: Bearer only).
    With ``attempts``, a client past its allowance of unknown keys gets 429."""

    def __init__(
        self,
        keys_file: Path | None,
        keys: KeyRing | None = None,
        sessions: LoginSessions | None = None,
        attempts: FailedKeyAttempts | None = None,
    ) -> None:
        self.keys_file = keys_file
        self._keys = keys
        self.sessions = sessions
        self.attempts = attempts
        self._watch = KeyFileWatch(keys_file) if keys_file is not None else None

    def _ring(self) -> KeyRing | None:
        """The current keys, followed by the file's content; ``None`` when no file exists."""
        if self._watch is None:
            return self._keys
        return self._watch.current()

    @property
    def open_mode(self) -> bool:
        """True when no key file exists (the page is then open on loopback only)."""
        return self._ring() is None

    def authorize(self, token: str | None) -> ApiKey | None:
        """The key behind ``token``, if the key file knows it."""
        ring = self._ring()
        return ring.authorize(token) if ring is not None else None

    def check_attempts(self, client_host: str | None) -> None:
        """429 with ``Retry-After`` while the client has spent its allowance of unknown
        keys: before its key is looked at, so a refused guess tells it nothing."""
        if self.attempts is None:
            return
        wait_s = self.attempts.retry_after(client_of(client_host))
        if wait_s is not None:
            raise PageError(
                429,
                f"too many unknown keys from your address: try again in {wait_s} s",
                headers={"Retry-After": str(wait_s)},
            )

    def _checked_key(self, ring: KeyRing, token: str, client_host: str | None) -> ApiKey | None:
        """The key behind ``token`` for a client within its allowance (an unknown one is
        counted against the client)."""
        self.check_attempts(client_host)
        key = ring.authorize(token)
        if key is None and self.attempts is not None:
            self.attempts.failed(client_of(client_host))
        return key

    def log_in(self, token: str | None, client_host: str | None = None) -> Login | None:
        """A new session for the key behind ``token``; None when the key is unknown (or
        this page keeps no sessions); 429 for a client past its allowance."""
        ring = self._ring()
        key = self._checked_key(ring, token or "", client_host) if ring is not None else None
        if key is None or self.sessions is None:
            return None
        lifetime_s = int(self.sessions.lifetime.total_seconds())
        return Login(key, self.sessions.open(key), lifetime_s)

    def log_out(self, session_id: str | None) -> None:
        """End the session behind ``session_id`` (a replayed cookie then gets 401)."""
        if self.sessions is not None:
            self.sessions.close(session_id)

    def _session_key(self, ring: KeyRing, session_id: str) -> ApiKey | None:
        """The key of a live session, as the key file has it now."""
        session = self.sessions.find(session_id) if self.sessions is not None else None
        return ring.by_digest(session.key_sha256) if session is not None else None

    def viewer(
        self, authorization: str | None, cookie: str | None, client_host: str | None
    ) -> Viewer:
        """The caller of a request (a Bearer key, else the session of ``cookie``); 401
        without a valid key or live session, 403 for open mode off loopback."""
        ring = self._ring()
        if ring is None:
            if not is_loopback(client_host):
                raise PageError(
                    403,
                    "no API keys are configured, so the feedback page only answers on loopback; "
                    "create one with `flywheel gateway add-key NAME --lines LINES` and log in",
                )
            return Viewer(name="local", key=None, open_mode=True)
        token = bearer_token(authorization)
        if token:
            key = self._checked_key(ring, token, client_host)
            if key is None:
                raise PageError(401, "unknown API key")
            return Viewer(name=key.name, key=key)
        if not cookie:
            raise PageError(401, "log in with a gateway API key (or send Authorization: Bearer)")
        key = self._session_key(ring, cookie)
        if key is None:
            raise PageError(
                401, "your login has ended (logged out, expired or its key removed): log in again"
            )
        return Viewer(name=key.name, key=key)


def check_line(viewer: Viewer, business_line: str, known: Collection[str]) -> None:
    """403 for a line the caller's key may not see, 404 for one nobody knows (in that
    order, so a key limited to some lines learns nothing about the others)."""
    if not viewer.may_see(business_line):
        raise PageError(403, f"your key ({viewer.name}) may not see {business_line!r}")
    if business_line not in known:
        raise PageError(404, f"unknown business line {business_line!r}")
