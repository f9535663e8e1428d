"""A private, throwaway PostgreSQL server that a test may stop and start at will.

The machine's shared cluster (127.0.0.1:5432) serves every other test and must stay up; an
outage test needs a server of its own. ``PrivatePostgres`` runs ``initdb`` into a folder, starts
the server on 127.0.0.1 at a port reserved for the object's whole life (a restart comes back on
the same port, so client URLs stay valid), and deletes everything on ``close()``::

    with PrivatePostgres(tmp_path / "pg") as pg:
        engine = create_engine(pg.url)
        ...
        pg.stop()  # clients now get "connection refused"
        pg.start()  # same port, same data

PostgreSQL refuses to run as root. When the tests run as root, the server binaries run as the
``postgres`` system user, and when that user cannot reach ``root`` (pytest's ``tmp_path`` lives
under ``/tmp/pytest-of-root``, mode 0700) the instance lives in a fresh folder under ``/tmp``
instead, with a symlink ``root/instance`` pointing at it.

Only the standard library is used; the database is created with the ``createdb`` client.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import pwd
import re
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, Self

__all__ = ["PrivatePostgres", "PrivatePostgresUnavailable", "find_bindir", "free_port"]

StopMode = Literal["smart", "fast", "immediate"]

_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres", "createdb")
_SERVER_USER = "postgres"
_CONF_NAME = "private_instance.conf"
# sun_path holds 108 bytes; PostgreSQL adds "/.s.PGSQL.<port>.lock" to the folder.
_SOCKET_PATH_MAX = 107 - len("/.s.PGSQL.65535.lock")
_LOG_TAIL_CHARS = 4000


class PrivatePostgresUnavailable(RuntimeError):  # noqa: N818 - the name says what a test skips on
    """No private PostgreSQL server can run here; the message says why (tests may skip on it)."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that was free a moment ago (the kernel's pick for port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _reserve_port(host: str, port: int) -> socket.socket:
    """Bind, without listening, a socket that keeps ``port`` from other programs.

    The socket sets SO_REUSEADDR, as the PostgreSQL server does on its own listening socket, so
    Linux lets the server bind and listen beside it; a program without SO_REUSEADDR cannot bind
    the port, and the kernel does not hand it out as an ephemeral port. While the server is down
    nothing listens, so clients get "connection refused" at once. The socket is not inherited by
    child processes (Python sockets are close-on-exec).
    """
    reservation = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    reservation.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        reservation.bind((host, port))
    except OSError as exc:
        reservation.close()
        raise PrivatePostgresUnavailable(f"cannot reserve {host}:{port}: {exc}") from exc
    return reservation


def _major_version(bindir: Path) -> tuple[int, ...]:
    """The version of the server binaries in ``bindir``, e.g. (16, 2); () when unknown."""
    try:
        out = subprocess.run(
            [str(bindir / "pg_ctl"), "--version"],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    match = re.search(r"(\d+)(?:\.(\d+))?", out)
    if match is None:
        return ()
    return tuple(int(part) for part in match.groups() if part is not None)


def find_bindir() -> Path:
    """The folder of the newest PostgreSQL server binaries on this machine.

    Looks at ``$FLYWHEEL_PG_BINDIR`` first (used as is), then ``pg_config --bindir``,
    ``/usr/lib/postgresql/*/bin`` (Debian, Ubuntu) and the folder of ``initdb`` on ``PATH``,
    and keeps the newest folder that holds initdb, pg_ctl, postgres and createdb.

    Raises:
        PrivatePostgresUnavailable: no such folder exists.
    """
    override = os.environ.get("FLYWHEEL_PG_BINDIR")
    if override:
        path = Path(override)
        missing = [name for name in _REQUIRED_BINARIES if not (path / name).is_file()]
        if missing:
            raise PrivatePostgresUnavailable(
                f"FLYWHEEL_PG_BINDIR={override} lacks {', '.join(missing)}"
            )
        return path

    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [pg_config, "--bindir"], capture_output=True, text=True, check=True, timeout=30
            ).stdout.strip()
            if out:
                candidates.append(Path(out))
    candidates.extend(sorted(Path("/usr/lib/postgresql").glob("*/bin")))
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(initdb).resolve().parent)

    usable: dict[Path, tuple[int, ...]] = {}
    for candidate in candidates:
        resolved = candidate.resolve()
        if resolved in usable:
            continue
        if all(os.access(resolved / name, os.X_OK) for name in _REQUIRED_BINARIES):
            usable[resolved] = _major_version(resolved)
    if not usable:
        looked = ", ".join(str(c) for c in candidates) or "nothing found"
        raise PrivatePostgresUnavailable(
            "no PostgreSQL server binaries (initdb, pg_ctl, postgres, createdb) found; looked at "
            f"pg_config --bindir, /usr/lib/postgresql/*/bin and PATH ({looked}); install the "
            "server package or set FLYWHEEL_PG_BINDIR"
        )
    return max(usable, key=lambda path: usable[path])


def _as_user_prefix(user: pwd.struct_passwd) -> list[str] | None:
    """A command prefix that runs the rest of the line as ``user``; None when root has none."""
    runuser = shutil.which("runuser")
    if runuser:
        return [runuser, "-u", user.pw_name, "--"]
    setpriv = shutil.which("setpriv")
    if setpriv:
        return [
            setpriv,
            f"--reuid={user.pw_uid}",
            f"--regid={user.pw_gid}",
            "--init-groups",
            "--",
        ]
    return None


class PrivatePostgres:
    """A PostgreSQL server of one's own, on 127.0.0.1, that can be stopped and restarted.

    Args:
        root: the instance folder (created when missing). It holds ``data/`` (the cluster),
            ``socket/`` (the Unix socket, unless its path is too long, then a short folder
            under /tmp is used), ``server.log`` and the config include. Running as root,
            when the ``postgres`` user cannot reach ``root``, these live in a fresh folder
            under /tmp and ``root/instance`` links to it; see ``base_dir``.
        port: the TCP port; by default a free one, picked now. It is reserved (bound, not
            listened on) until ``close()``, so every restart comes back on it.
        user: the superuser name the cluster is created with.
        database: the database that ``url`` names, created on the first start.
        start_timeout: seconds ``pg_ctl start -w`` may wait for the server to accept connections.

    Raises:
        PrivatePostgresUnavailable: no server binaries, running as root without a ``postgres``
            user or a way to switch to it, or the port cannot be reserved.
    """

    host = "127.0.0.1"

    def __init__(
        self,
        root: Path,
        port: int | None = None,
        *,
        user: str = "postgres",
        database: str = "flywheel",
        start_timeout: float = 60.0,
    ) -> None:
        self.root = Path(root).absolute()
        self.user = user
        self.database = database
        self.start_timeout = start_timeout
        self.bindir = find_bindir()
        self._server_user: pwd.struct_passwd | None = None
        self._prefix: list[str] = []
        if os.geteuid() == 0:
            try:
                self._server_user = pwd.getpwnam(_SERVER_USER)
            except KeyError as exc:
                raise PrivatePostgresUnavailable(
                    f"running as root, and PostgreSQL refuses root, but there is no "
                    f"{_SERVER_USER!r} system user to run it as"
                ) from exc
            prefix = _as_user_prefix(self._server_user)
            if prefix is None:
                raise PrivatePostgresUnavailable(
                    "running as root, and neither runuser nor setpriv exists to run the "
                    f"server as {_SERVER_USER!r}"
                )
            self._prefix = prefix
        self.port = port if port is not None else free_port(self.host)
        self._reservation: socket.socket | None = _reserve_port(self.host, self.port)
        self._root_existed = self.root.exists()
        self._base: Path | None = None
        self._socket_dir: Path | None = None
        self._owned_dirs: list[Path] = []
        self._atexit_registered = False
        self._closed = False
        self.timings: dict[str, float] = {}
        """Seconds the last initdb, createdb, start and stop took (for reports)."""

    # ---------------------------------------------------------------- paths and URL

    @property
    def base_dir(self) -> Path:
        """The folder that really holds the instance: ``root``, or a /tmp folder (see class)."""
        if self._base is None:
            self._base = self._prepare_base()
        return self._base

    @property
    def data_dir(self) -> Path:
        """The cluster's data directory."""
        return self.base_dir / "data"

    @property
    def log_path(self) -> Path:
        """The server's log file (appended to across restarts)."""
        return self.base_dir / "server.log"

    @property
    def socket_dir(self) -> Path:
        """The folder of the server's Unix socket."""
        if self._socket_dir is None:
            wanted = self.base_dir / "socket"
            if len(str(wanted)) > _SOCKET_PATH_MAX:
                wanted = Path(tempfile.mkdtemp(prefix="pgsock-", dir="/tmp"))
                self._owned_dirs.append(wanted)
            wanted.mkdir(mode=0o700, exist_ok=True)
            self._chown(wanted)
            self._socket_dir = wanted
        return self._socket_dir

    @property
    def url(self) -> str:
        """``postgresql+psycopg://<user>@127.0.0.1:<port>/<database>`` (valid across restarts)."""
        return f"postgresql+psycopg://{self.user}@{self.host}:{self.port}/{self.database}"

    @property
    def dsn(self) -> str:
        """The same address as ``url`` in libpq form, for psycopg.connect()."""
        return f"host={self.host} port={self.port} user={self.user} dbname={self.database}"

    # ---------------------------------------------------------------- lifecycle

    def start(self) -> None:
        """Start the server and wait until it accepts connections; a running server is left be.

        The first start runs initdb (trust authentication, fsync off) and creates ``database``.

        Raises:
            RuntimeError: initdb, pg_ctl or createdb failed (the message has the server log).
        """
        self._check_open()
        if self.is_running():
            return
        first = not (self.data_dir / "PG_VERSION").exists()
        if first:
            self._initdb()
        self._write_conf()
        began = time.monotonic()
        self._run_server_tool(
            [
                str(self.bindir / "pg_ctl"),
                "start",
                "-w",
                "-t",
                str(max(1, round(self.start_timeout))),
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_path),
            ],
            what="pg_ctl start",
        )
        self.timings["start"] = time.monotonic() - began
        if not self._atexit_registered:
            atexit.register(self.close)  # no server outlives an interrupted test run
            self._atexit_registered = True
        if first:
            self._createdb()

    def stop(self, mode: StopMode = "fast") -> None:
        """Stop the server and wait until it is gone; a stopped server is left be.

        The port stays reserved, so ``start()`` comes back on it.

        Args:
            mode: ``"smart"`` waits for clients to leave, ``"fast"`` disconnects them and shuts
                down cleanly, ``"immediate"`` aborts (crash recovery on the next start).
        """
        if not self.is_running():
            return
        began = time.monotonic()
        self._run_server_tool(
            [str(self.bindir / "pg_ctl"), "stop", "-w", "-m", mode, "-D", str(self.data_dir)],
            what="pg_ctl stop",
        )
        self.timings["stop"] = time.monotonic() - began

    def restart(self, mode: StopMode = "fast") -> None:
        """``stop(mode)`` then ``start()``, on the same port."""
        self.stop(mode)
        self.start()

    def is_running(self) -> bool:
        """Whether the server process is up (``pg_ctl status``); not whether it is ready yet."""
        if self._closed or not (self.data_dir / "PG_VERSION").exists():
            return False
        result = subprocess.run(
            [*self._prefix, str(self.bindir / "pg_ctl"), "status", "-D", str(self.data_dir)],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.base_dir,
            env=self._env(),
            timeout=60,
        )
        return result.returncode == 0

    def close(self) -> None:
        """Stop the server at once and delete every file of the instance; idempotent.

        ``root`` is removed when this object created it; otherwise only what it put there.
        """
        if self._closed:
            return
        try:
            if self._base is not None:
                with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                    self.stop("immediate")
        finally:
            self._closed = True
            atexit.unregister(self.close)
            self._atexit_registered = False
            if self._reservation is not None:
                self._reservation.close()
                self._reservation = None
            self._remove_files()

    def __enter__(self) -> Self:
        """Start the server (see ``start``)."""
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the server and delete the instance (see ``close``)."""
        self.close()

    def __repr__(self) -> str:
        """Where the instance lives and whether it is closed."""
        state = "closed" if self._closed else f"port={self.port}"
        return f"PrivatePostgres({str(self.root)!r}, {state})"

    def log_tail(self, chars: int = _LOG_TAIL_CHARS) -> str:
        """The end of the server log, for error messages."""
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # ---------------------------------------------------------------- internals

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self!r} is closed")

    def _env(self) -> dict[str, str]:
        """The environment minus PG* variables, which would steer the tools elsewhere."""
        env = {key: value for key, value in os.environ.items() if not key.startswith("PG")}
        env["LC_ALL"] = "C"
        if self._server_user is not None:
            env["HOME"] = self._server_user.pw_dir
            env["USER"] = env["LOGNAME"] = self._server_user.pw_name
        return env

    def _chown(self, path: Path) -> None:
        if self._server_user is not None:
            os.chown(path, self._server_user.pw_uid, self._server_user.pw_gid)

    def _server_user_can_write(self, path: Path) -> bool:
        result = subprocess.run(
            [*self._prefix, "test", "-w", str(path)],
            capture_output=True,
            check=False,
            cwd="/",
            timeout=60,
        )
        return result.returncode == 0

    def _prepare_base(self) -> Path:
        """Create the instance folder, owned by the user the server runs as."""
        self.root.mkdir(parents=True, exist_ok=True)
        if self._server_user is None:
            return self.root
        self._chown(self.root)
        self.root.chmod(0o700)
        if self._server_user_can_write(self.root):
            return self.root
        base = Path(tempfile.mkdtemp(prefix="flywheel-pg-", dir="/tmp"))
        self._owned_dirs.append(base)
        self._chown(base)
        base.chmod(0o700)
        if not self._server_user_can_write(base):
            raise PrivatePostgresUnavailable(
                f"the {_SERVER_USER!r} user can reach neither {self.root} nor {base}"
            )
        link = self.root / "instance"
        with contextlib.suppress(OSError):
            link.unlink(missing_ok=True)
            link.symlink_to(base, target_is_directory=True)
        return base

    def _run_server_tool(self, command: Sequence[str], *, what: str) -> None:
        """Run a server binary (as the ``postgres`` user when we are root)."""
        result = subprocess.run(
            [*self._prefix, *command],
            capture_output=True,
            text=True,
            check=False,
            cwd=self.base_dir,
            env=self._env(),
            timeout=self.start_timeout + 60,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed (exit {result.returncode}) for {self.data_dir}:\n"
                f"{result.stdout}{result.stderr}\n--- server log ---\n{self.log_tail()}"
            )

    def _initdb(self) -> None:
        began = time.monotonic()
        self._run_server_tool(
            [
                str(self.bindir / "initdb"),
                "-D",
                str(self.data_dir),
                "-U",
                self.user,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            what="initdb",
        )
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write(f"\n# Settings of this private test instance.\ninclude '{_CONF_NAME}'\n")
        self.timings["initdb"] = time.monotonic() - began

    def _write_conf(self) -> None:
        """Write the per-start settings (rewritten each start: port and socket folder).

        fsync and full_page_writes are off: they only guard against an operating-system crash.
        synchronous_commit stays on, so a commit acknowledged before ``stop("immediate")``
        survives it, which is what an outage test checks.
        """
        socket_dir = str(self.socket_dir).replace("'", "''")
        settings = {
            "listen_addresses": "'127.0.0.1'",
            "port": str(self.port),
            "unix_socket_directories": f"'{socket_dir}'",
            "fsync": "off",
            "full_page_writes": "off",
            "max_connections": "100",
            "shared_buffers": "'32MB'",
            "logging_collector": "off",
            "log_min_messages": "warning",
        }
        path = self.data_dir / _CONF_NAME
        path.write_text("".join(f"{key} = {value}\n" for key, value in settings.items()))
        self._chown(path)
        path.chmod(0o600)

    def _createdb(self) -> None:
        if self.database == "postgres":
            return
        began = time.monotonic()
        result = subprocess.run(
            [
                str(self.bindir / "createdb"),
                "-h",
                self.host,
                "-p",
                str(self.port),
                "-U",
                self.user,
                self.database,
            ],
            capture_output=True,
            text=True,
            check=False,
            env=self._env(),
            timeout=60,
        )
        if result.returncode != 0 and "already exists" not in result.stderr:
            raise RuntimeError(f"createdb {self.database} failed: {result.stderr}")
        self.timings["createdb"] = time.monotonic() - began

    def _remove_files(self) -> None:
        for owned in self._owned_dirs:
            shutil.rmtree(owned, ignore_errors=True)
        if not self._root_existed:
            shutil.rmtree(self.root, ignore_errors=True)
            return
        if self._base is None:
            return
        for name in ("data", "socket", "server.log", "instance"):
            path = self.root / name
            if path.is_symlink() or path.is_file():
                path.unlink(missing_ok=True)
            elif path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
