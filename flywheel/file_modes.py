"""Owner-only modes for the files flywheel writes that hold users' text.

The store, its WAL, the gateway's spool, datasets and logs hold raw prompts and answers,
so they are created 0600 (files) and 0700 (folders) whatever the process umask says: a
mode given to ``os.open`` or ``mkdir`` is masked by the umask, which can only take bits
away, and a folder made by ``mkdir(parents=True)`` gets the umask's default; so every
creation here is followed by an explicit ``chmod`` where the umask could have widened it.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from flywheel.errors import InvalidSettingsError

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) as owner-only folders; an existing folder's
    mode is tightened too. Returns ``path``."""
    missing = []
    current = path
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    path.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    for folder in [*missing, path]:
        with contextlib.suppress(FileNotFoundError):
            folder.chmod(PRIVATE_DIR)
    return path


def private_home(home: Path) -> Path:
    """The home folder (``FLYWHEEL_HOME``) made as :func:`private_dir` makes a folder; one
    that cannot be made or written (a file in its way, no permission, a read-only disk) is an
    :class:`~flywheel.errors.InvalidSettingsError` naming the variable (exit 2)."""
    if home.exists() and not home.is_dir():
        raise InvalidSettingsError(f"FLYWHEEL_HOME={home}: is a file, not a folder")
    try:
        private_dir(home)
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(home) else ""
        raise InvalidSettingsError(
            f"FLYWHEEL_HOME={home}: cannot be made a folder: {exc.strerror or exc}{where}"
        ) from None
    if not os.access(home, os.W_OK | os.X_OK):
        raise InvalidSettingsError(f"FLYWHEEL_HOME={home}: this user cannot write in it")
    return home


def restrict(path: Path) -> None:
    """Make an existing file owner-only (a file another library created, like SQLite's);
    nothing when it does not exist (yet)."""
    with contextlib.suppress(FileNotFoundError):
        path.chmod(PRIVATE_FILE)


def open_private(path: Path, flags: int = os.O_WRONLY | os.O_CREAT | os.O_TRUNC) -> int:
    """A file descriptor of ``path`` opened with ``flags``, created 0600 (and made 0600
    if it existed): for ``os.fdopen``."""
    descriptor = os.open(path, flags, PRIVATE_FILE)
    os.fchmod(descriptor, PRIVATE_FILE)
    return descriptor


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as an owner-only file."""
    with os.fdopen(open_private(path), "wb") as out:
        out.write(data)
