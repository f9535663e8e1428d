"""API keys: which business lines a caller may use.

The key file (YAML) keeps only SHA-256 digests of the keys, so reading it does
not reveal them; ``flywheel gateway add-key`` prints a new key once::

    keys:
      - name: support-team
        sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08
        business_lines: [customer_service]
        review_lines: [customer_service]   # optional: the reviewer role on these lines
      - name: platform
        sha256: ...
        business_lines: ["*"]        # every line
        limits: {requests_per_min: 600, tokens_per_min: 200000, concurrent_streams: 16,
                 max_output_tokens: 2048}
      - name: prometheus
        sha256: ...
        operator: true               # the operator role; no lines: it sends no traffic
    lines:                             # limits of a whole line, over all its keys
      customer_service: {requests_per_min: 3000, feedback_per_min: 6000}

Limits are optional (unset: unlimited); see :mod:`gateway.limits`.

The operator role (``operator: true``, ``flywheel gateway add-key NAME --operator``) is
what the gateway's ``/metrics`` and the detail of its ``/healthz`` ask for: they show
every line's traffic, adapters (canaries included) and routing revisions, which no
tenant's key may read. Without a key ``/healthz`` answers liveness only. A Prometheus
scrape sends the key as a bearer token (``authorization: {credentials_file: ...}`` in
its scrape config).
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from feedback.events import KEY_NAME
from flywheel.errors import UsageError
from flywheel.lines import LINE_NAME_RULE, is_line_name
from gateway.limits import Limits

logger = logging.getLogger(__name__)
ALL_LINES = "*"
KEY_PREFIX = "fw-"


def key_digest(token: str) -> str:
    """The SHA-256 hex digest a key is stored and looked up by."""
    return hashlib.sha256(token.encode()).hexdigest()


class ApiKey(BaseModel):
    """One caller: a name for the logs, the digest of its key and the lines it may use."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # Recorded with every interaction it sends (the store's interactions.key_name).
    name: str = Field(pattern=KEY_NAME)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    # At least one line, unless the key is an operator's only.
    business_lines: tuple[str, ...] = ()
    limits: Limits = Field(default_factory=Limits)
    # vLLM's fields past sampling (a chat template, priority, ...): see gateway.wire.
    allow_server_fields: bool = False
    # Lines whose review queue this key works on the feedback page (a reviewer role per
    # line; "*": every line it may use). A key file without it grants no review role.
    review_lines: tuple[str, ...] = ()
    # The operator role: every line's metrics and routing state (not their traffic).
    operator: bool = False

    @field_validator("business_lines", "review_lines")
    @classmethod
    def _line_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return _checked_lines(value)

    @model_validator(mode="after")
    def _grants_something(self) -> ApiKey:
        if not self.business_lines and not self.operator:
            raise ValueError("business_lines: name at least one line ('*': every line)")
        return self

    def may_use(self, business_line: str) -> bool:
        """Whether this key may send traffic or feedback for ``business_line``."""
        return ALL_LINES in self.business_lines or business_line in self.business_lines

    def may_review(self, business_line: str) -> bool:
        """Whether this key holds the reviewer role on ``business_line`` (a line it may use)."""
        named = ALL_LINES in self.review_lines or business_line in self.review_lines
        return named and self.may_use(business_line)

    def lines_among(self, known: Iterable[str]) -> list[str]:
        """The known lines this key may use, sorted."""
        return sorted(line for line in known if self.may_use(line))


class _KeyFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    keys: list[ApiKey] = Field(default_factory=list)
    lines: dict[str, Limits] = Field(default_factory=dict)

    @field_validator("lines")
    @classmethod
    def _line_names(cls, value: dict[str, Limits]) -> dict[str, Limits]:
        _checked_lines(tuple(value), every=False)
        return value


def _checked_lines(lines: tuple[str, ...], *, every: bool = True) -> tuple[str, ...]:
    """``lines`` when each is a business line's name (or, with ``every``, "*")."""
    wrong = [line for line in lines if not (is_line_name(line) or (every and line == ALL_LINES))]
    if wrong:
        names = ", ".join(repr(line) for line in wrong)
        raise ValueError(f"{names}: a business line's name is {LINE_NAME_RULE} characters")
    return lines


class KeyRing:
    """The keys a gateway accepts, looked up by digest, and each line's limits."""

    def __init__(self, keys: Iterable[ApiKey], lines: dict[str, Limits] | None = None) -> None:
        self._by_digest = {key.sha256: key for key in keys}
        self.line_limits: dict[str, Limits] = dict(lines or {})

    def __len__(self) -> int:
        return len(self._by_digest)

    @classmethod
    def load(cls, path: Path) -> KeyRing:
        """Read a key file; a missing file is an empty ring (every request gets 401)."""
        if not path.exists():
            return cls(())
        found = _read(path)
        return cls(found.keys, found.lines)

    def authorize(self, token: str | None) -> ApiKey | None:
        """The key behind ``token`` (a bearer token), or None when it is unknown."""
        if not token:
            return None
        return self._by_digest.get(key_digest(token))

    def by_digest(self, digest: str) -> ApiKey | None:
        """The key stored under ``digest``, or None when the file no longer has it."""
        return self._by_digest.get(digest)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


# A key file of this size holds tens of thousands of keys; a larger one is a mistake, and
# the gateway re-reads the file on every change, so it is never read whole.
MAX_KEY_FILE_BYTES = 8 * 1024 * 1024


def _key_file_bytes(path: Path) -> bytes:
    """The key file's bytes, at most :data:`MAX_KEY_FILE_BYTES` (UsageError beyond; a
    missing file raises FileNotFoundError)."""
    with path.open("rb") as source:
        content = source.read(MAX_KEY_FILE_BYTES + 1)
    if len(content) > MAX_KEY_FILE_BYTES:
        raise UsageError(
            f"{path}: larger than {MAX_KEY_FILE_BYTES // (1024 * 1024)} MB; not a key file"
        )
    return content


def _read(path: Path) -> _KeyFile:
    return _parse(_key_file_bytes(path), path)


def _parse(content: bytes, path: Path) -> _KeyFile:
    try:
        data = yaml.safe_load(content.decode("utf-8")) or {}
        return _KeyFile.model_validate(data)
    except (yaml.YAMLError, ValidationError, UnicodeDecodeError) as exc:
        raise UsageError(f"{path}: not a valid key file: {exc}") from None


class KeyFileWatch:
    """A key file followed by its content, for servers that must see a revoked key at once:
    re-read at most every ``min_interval_s``, compared by digest (an edit that keeps the
    mtime counts), and a file that does not parse keeps the last good keys with an error
    in the log (once per broken version) — never an open door, never a crash.
    ``current()`` is None while no file exists."""

    def __init__(self, path: Path, min_interval_s: float = 0.25) -> None:
        self.path = path
        self.min_interval_s = min_interval_s
        self._lock = threading.Lock()
        self._ring: KeyRing | None = None
        self._digest: str | None = None
        self._broken: str | None = None
        self._next_read = 0.0

    def current(self) -> KeyRing | None:
        """The keys as the file last parsed."""
        with self._lock:
            now = time.monotonic()
            if now < self._next_read:
                return self._ring
            self._next_read = now + self.min_interval_s
            try:
                content = _key_file_bytes(self.path)
            except FileNotFoundError:
                self._ring, self._digest = None, None
                return None
            except UsageError as exc:
                return self._keep_last_good(exc, f"oversize:{self.path.stat().st_size}")
            digest = hashlib.sha256(content).hexdigest()
            if digest in (self._digest, self._broken):
                return self._ring
            try:
                found = _parse(content, self.path)
            except UsageError as exc:
                return self._keep_last_good(exc, digest)
            self._ring, self._digest, self._broken = KeyRing(found.keys, found.lines), digest, None
            return self._ring

    def _keep_last_good(self, error: UsageError, broken: str) -> KeyRing:
        """The last good keys after a file that cannot be used (logged once per version)."""
        if broken != self._broken:
            self._broken = broken
            kept = len(self._ring) if self._ring is not None else 0
            logger.error("%s; keeping the last good keys (%d)", error, kept)
        if self._ring is None:
            self._ring = KeyRing(())  # never parsed: nobody gets in
        return self._ring


def add_key(
    path: Path,
    name: str,
    business_lines: Iterable[str],
    review_lines: Iterable[str] = (),
    *,
    operator: bool = False,
) -> str:
    """Create a key for ``business_lines`` (a reviewer on ``review_lines``; with the operator
    role when ``operator``) in the file at ``path``; return the key itself (shown once: the
    file keeps only its digest)."""
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    current = _read(path) if path.exists() else _KeyFile()
    if any(key.name == name for key in current.keys):
        raise UsageError(f"{path}: a key named {name!r} exists already")
    try:
        entry = ApiKey(
            name=name,
            sha256=key_digest(token),
            business_lines=tuple(business_lines),
            review_lines=tuple(review_lines),
            operator=operator,
        )
    except ValidationError as exc:
        raise UsageError(f"bad key {name!r}: {exc.errors()[0]['msg']}") from None
    current.keys.append(entry)
    _write(path, current)
    return token


def rotate_key(path: Path, name: str) -> str:
    """Give the key named ``name`` a new secret, keeping its name, lines, roles and limits;
    return the new key (shown once). The old secret stops working at the gateway's next read
    of the file. Its traffic stays one key's: what one key may move in a canary's look or a
    training set is bounded by name, so a rotated key is not a second key."""
    token = KEY_PREFIX + secrets.token_urlsafe(32)
    current = _read(path) if path.exists() else _KeyFile()
    for index, key in enumerate(current.keys):
        if key.name == name:
            current.keys[index] = key.model_copy(update={"sha256": key_digest(token)})
            _write(path, current)
            return token
    raise UsageError(f"{path}: no key named {name!r}")


def _write(path: Path, keys: _KeyFile) -> None:
    """Replace the key file at once (readable by its owner only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".tmp")
    with os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        yaml.safe_dump(keys.model_dump(mode="json", exclude_defaults=True), out, sort_keys=False)
    partial.replace(path)
