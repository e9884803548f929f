"""A throwaway PostgreSQL server for tests, run from the installed binaries.

``EmbeddedPostgres`` runs ``initdb`` into a temp dir and starts ``postgres`` on a free loopback
port with its socket in that dir and trust authentication; ``stop()`` shuts it down and removes
the dir. It needs the server binaries, e.g. Debian's ``postgresql`` package
(``/usr/lib/postgresql/<version>/bin``); ``WEIR_POSTGRES_BINDIR`` names another directory.
``postgres_for_tests()`` prefers a server you run (``WEIR_POSTGRES_DSN``).

PostgreSQL refuses to run as root. Run as root, the harness runs ``initdb`` and ``postgres`` as
the ``postgres`` user (created by the Debian package), else as ``nobody``, in a temp dir it hands
to that user.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

from weir.logs import get_logger
from weir.testing.broker import (
    LOOPBACK,
    _die_with_parent_hook,
    pick_free_port,
    port_accepts,
    register_at_exit,
    require_free_port,
    resolve_workdir,
    unregister_at_exit,
)
from weir.testing.errors import PostgresNotFoundError, PostgresStartError

__all__ = [
    "ENV_BINDIR",
    "ENV_DSN",
    "TEST_POSTGRES_SETTINGS",
    "EmbeddedPostgres",
    "PostgresNotFoundError",
    "PostgresStartError",
    "find_postgres_bindir",
    "postgres_for_tests",
]

log = get_logger(__name__)

ENV_DSN = "WEIR_POSTGRES_DSN"
ENV_BINDIR = "WEIR_POSTGRES_BINDIR"
DEBIAN_ROOT = Path("/usr/lib/postgresql")
DEFAULT_START_TIMEOUT_S = 60.0
DEFAULT_STOP_TIMEOUT_S = 15.0
INITDB_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 40
_PORT_ATTEMPTS = 3
_BIND_FAILURE = "Address already in use"
_UNPRIVILEGED_USERS = ("postgres", "nobody")

# Each differs from PostgreSQL's default for a reason a test run can feel:
TEST_POSTGRES_SETTINGS: Mapping[str, str] = {
    # A throwaway cluster: durability across a power cut is not under test, and fsyncs on a
    # machine shared with brokers cost seconds. Transactions and locks behave as ever.
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # Many fences with a connection per worker thread, several tests at once.
    "max_connections": "200",
    # English messages whatever the machine's locale: tests and the harness read them.
    "lc_messages": "C",
}


def find_postgres_bindir() -> Path:
    """The directory holding ``initdb`` and ``postgres``: ``$WEIR_POSTGRES_BINDIR``, else the
    newest ``/usr/lib/postgresql/<version>/bin``, else the directory of ``initdb`` on PATH."""
    override = os.environ.get(ENV_BINDIR)
    if override:
        path = Path(override)
        if not _has_server(path):
            raise PostgresNotFoundError(
                f"{ENV_BINDIR}={override} does not hold the initdb and postgres executables"
            )
        return path
    versions = []
    if DEBIAN_ROOT.is_dir():
        for child in DEBIAN_ROOT.iterdir():
            if re.fullmatch(r"\d+(\.\d+)?", child.name) and _has_server(child / "bin"):
                versions.append((tuple(int(n) for n in child.name.split(".")), child / "bin"))
    if versions:
        return max(versions)[1]
    initdb = shutil.which("initdb")
    if initdb is not None:
        path = Path(initdb).resolve().parent
        if _has_server(path):
            return path
    raise PostgresNotFoundError(
        "PostgreSQL server binaries (initdb, postgres) not found: install them (Debian: "
        f"apt-get install postgresql), set {ENV_BINDIR} to their directory, or set {ENV_DSN} to "
        "a server you run"
    )


def _has_server(path: Path) -> bool:
    return all(os.access(path / name, os.X_OK) for name in ("initdb", "postgres"))


class EmbeddedPostgres:
    """A PostgreSQL server in a temp dir on a free loopback port, for tests.

    >>> with EmbeddedPostgres() as pg:
    ...     conn = psycopg.connect(pg.dsn)

    ``settings`` are passed as ``-c name=value`` over ``TEST_POSTGRES_SETTINGS``. The superuser
    is ``user`` (trust authentication on loopback and the socket: no password). A bind race on
    the picked port is retried with a new port; an explicit ``port`` that is taken raises
    ``PortInUseError`` before anything starts.
    """

    def __init__(
        self,
        *,
        bindir: str | Path | None = None,
        workdir: str | Path | None = None,
        keep: bool | None = None,
        port: int | None = None,
        settings: Mapping[str, str] | None = None,
        user: str = "weir",
        start_timeout: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout: float = DEFAULT_STOP_TIMEOUT_S,
        die_with_parent: bool = True,
    ) -> None:
        self._bindir = Path(bindir) if bindir is not None else None
        self._requested_workdir = workdir
        self._keep = keep
        self._requested_port = port
        self.settings = {**TEST_POSTGRES_SETTINGS, **(settings or {})}
        self.user = user
        self.start_timeout = start_timeout
        self.stop_timeout = stop_timeout
        self._die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None
        self._workdir: Path | None = None
        self._remove_workdir = False
        self._port: int | None = None
        self._log_offset = 0
        self.started_in_s: float | None = None

    # -- what tests use --

    @property
    def dsn(self) -> str:
        return f"host={LOOPBACK} port={self.port} user={self.user} dbname=postgres"

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("EmbeddedPostgres is not started")
        return self._port

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def workdir(self) -> Path | None:
        return self._workdir

    @property
    def log_path(self) -> Path | None:
        return None if self._workdir is None else self._workdir / "postgres.log"

    # -- lifecycle --

    def start(self) -> EmbeddedPostgres:
        if self.running:
            return self
        if self._requested_port is not None:
            require_free_port(self._requested_port, "PostgreSQL")
        bindir = self._bindir or find_postgres_bindir()
        started = time.monotonic()
        deadline = started + self.start_timeout
        self._workdir, self._remove_workdir = resolve_workdir(
            self._requested_workdir, self._keep, "weir-postgres-"
        )
        try:
            owner = _run_as()
            if owner is not None:
                os.chown(self._workdir, owner.pw_uid, owner.pw_gid)
            self._initdb(bindir, owner)
            self._launch_until_ready(bindir, owner, deadline)
        except BaseException:  # Ctrl-C included: never leave a half-started server or its dir
            self._kill()
            self._cleanup_workdir()
            raise
        if self._die_with_parent:
            register_at_exit(self, self.stop)
        self.started_in_s = time.monotonic() - started
        log.info(
            "embedded_postgres_started",
            dsn=self.dsn,
            pid=self.pid,
            seconds=round(self.started_in_s, 2),
            bindir=str(bindir),
            run_as=owner.pw_name if owner is not None else None,
        )
        return self

    def stop(self) -> None:
        """Fast shutdown (SIGINT: running transactions are rolled back), SIGKILL after
        ``stop_timeout``; then the temp dir is removed."""
        unregister_at_exit(self)
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("postgres_ignored_sigint", pid=proc.pid)
                self._kill()
        self._proc = None
        self._cleanup_workdir()

    def __enter__(self) -> EmbeddedPostgres:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # -- internals --

    def _initdb(self, bindir: Path, owner: pwd.struct_passwd | None) -> None:
        assert self._workdir is not None
        command = [
            str(bindir / "initdb"),
            "--pgdata",
            str(self._workdir / "data"),
            "--username",
            self.user,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-sync",
        ]
        how = _Spawn.as_user(owner, self._workdir)
        with self._log_file() as out:
            out.write(f"--- weir: {' '.join(command)}\n".encode())
            out.flush()
            try:
                result = subprocess.run(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    timeout=INITDB_TIMEOUT_S,
                    check=False,
                    cwd=how.cwd,
                    user=how.user,
                    group=how.group,
                    extra_groups=how.extra_groups,
                    env=how.env,
                )
            except subprocess.TimeoutExpired as exc:
                raise PostgresStartError(
                    f"initdb took over {INITDB_TIMEOUT_S:.0f} s", self._log_tail()
                ) from exc
        if result.returncode != 0:
            raise PostgresStartError(f"initdb failed (exit {result.returncode})", self._log_tail())

    def _launch_until_ready(
        self, bindir: Path, owner: pwd.struct_passwd | None, deadline: float
    ) -> None:
        assert self._workdir is not None
        sockets = self._workdir / "socket"
        sockets.mkdir(exist_ok=True)
        if owner is not None:
            os.chown(sockets, owner.pw_uid, owner.pw_gid)
        for attempt in range(1, _PORT_ATTEMPTS + 1):
            port = self._requested_port or pick_free_port()
            self._launch(bindir, owner, port, sockets)
            try:
                self._wait_ready(port, deadline)
            except PostgresStartError:
                bind_race = _BIND_FAILURE in self._read_log(self._log_offset)
                self._kill()
                if bind_race and self._requested_port is None and attempt < _PORT_ATTEMPTS:
                    log.info("postgres_port_taken", port=port)
                    continue
                raise
            self._port = port
            return

    def _launch(
        self, bindir: Path, owner: pwd.struct_passwd | None, port: int, sockets: Path
    ) -> None:
        assert self._workdir is not None
        command = [
            str(bindir / "postgres"),
            "-D",
            str(self._workdir / "data"),
            "-p",
            str(port),
            "-k",
            str(sockets),
            "-c",
            f"listen_addresses={LOOPBACK}",
        ]
        for name, value in self.settings.items():
            command += ["-c", f"{name}={value}"]
        self._log_offset = self._log_size()
        how = _Spawn.as_user(owner, self._workdir)
        with self._log_file() as out:
            out.write(f"--- weir: {' '.join(command)}\n".encode())
            out.flush()
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Own session: a Ctrl-C reaches Python, which then stops the server cleanly.
                start_new_session=True,
                preexec_fn=_die_with_parent_hook() if self._die_with_parent else None,
                cwd=how.cwd,
                user=how.user,
                group=how.group,
                extra_groups=how.extra_groups,
                env=how.env,
            )

    def _wait_ready(self, port: int, deadline: float) -> None:
        """Ready: our postmaster wrote "ready" into postmaster.pid (what pg_ctl waits for) and the
        port accepts connections."""
        assert self._proc is not None and self._workdir is not None
        pid_file = self._workdir / "data" / "postmaster.pid"
        while True:
            code = self._proc.poll()
            if code is not None:
                raise PostgresStartError(
                    f"postgres exited with code {code} during start-up", self._log_tail()
                )
            lines = _read_lines(pid_file)
            if (
                len(lines) >= 8
                and lines[0].strip() == str(self._proc.pid)
                and lines[7].strip() == "ready"
                and port_accepts(port)
            ):
                return
            if time.monotonic() > deadline:
                raise PostgresStartError(
                    f"postgres did not become ready on {LOOPBACK}:{port} within "
                    f"{self.start_timeout:.0f} s",
                    self._log_tail(),
                )
            time.sleep(0.02)

    def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)
        self._proc = None

    def _cleanup_workdir(self) -> None:
        if self._workdir is not None and self._remove_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)

    @contextlib.contextmanager
    def _log_file(self) -> Iterator[BinaryIO]:
        path = self.log_path
        assert path is not None
        with path.open("ab") as out:
            yield out

    def _log_tail(self) -> str:
        return "\n".join(self._read_log(0).splitlines()[-LOG_TAIL_LINES:])

    def _read_log(self, since: int) -> str:
        path = self.log_path
        if path is None:
            return ""
        try:
            with path.open("rb") as handle:
                handle.seek(since)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def _log_size(self) -> int:
        path = self.log_path
        try:
            return path.stat().st_size if path is not None else 0
        except OSError:
            return 0


@contextlib.contextmanager
def postgres_for_tests() -> Iterator[str]:
    """A DSN for the block: ``$WEIR_POSTGRES_DSN`` (a server you run; never started or stopped
    here), else an ``EmbeddedPostgres`` started for the block. Raises ``PostgresNotFoundError``
    when there is neither."""
    external = os.environ.get(ENV_DSN)
    if external:
        yield external
        return
    server = EmbeddedPostgres(bindir=find_postgres_bindir())
    try:
        server.start()
        yield server.dsn
    finally:
        server.stop()


def _run_as() -> pwd.struct_passwd | None:
    """Who runs the server: None (ourselves) unless we are root, whom initdb and postgres refuse."""
    if os.geteuid() != 0:
        return None
    for name in _UNPRIVILEGED_USERS:
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise PostgresStartError(
        "running as root, and PostgreSQL refuses to: no 'postgres' or 'nobody' user to run it as"
    )


@dataclass(frozen=True)
class _Spawn:
    """How to start initdb and postgres: as ourselves, or (when root) as the server's user."""

    cwd: Path
    user: int | None = None
    group: int | None = None
    extra_groups: list[int] | None = None
    env: dict[str, str] | None = None

    @classmethod
    def as_user(cls, owner: pwd.struct_passwd | None, workdir: Path) -> _Spawn:
        # cwd: the server's user may not be allowed into ours (/root).
        if owner is None:
            return cls(cwd=workdir)
        return cls(
            cwd=workdir,
            user=owner.pw_uid,
            group=owner.pw_gid,
            extra_groups=[],
            env={**os.environ, "HOME": str(workdir), "USER": owner.pw_name},
        )


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return []
