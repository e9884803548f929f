"""Fixtures for every tier (members a test started, a busy port, an empty PATH for stand-ins of
java and mvn, a held work directory, PostgreSQL), and the unit tiers' rule.

tests/unit and tests/property start no process: no JVM, no PostgreSQL server, no child Python.
Such a test belongs in tests/integration; one that starts a process anyway (in its set-up or its
body) fails, naming what it started.

A real PostgreSQL server for the tests that ask for ``postgres_dsn`` (weir.testing.postgres):
started once per session, on first use, and stopped at its end. Such tests are skipped only
where no PostgreSQL can be had: no server binaries and no WEIR_POSTGRES_DSN, or no psycopg.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from weir import GroupConsumer
from weir.testing.broker import WorkdirLock
from weir.testing.cluster import FAST_START_JVM_ARGS
from weir.testing.postgres import (
    ENV_DSN,
    PostgresNotFoundError,
    find_postgres_bindir,
    postgres_for_tests,
)

UNIT_TIERS = ("unit", "property")
_PROCESS_EVENTS = frozenset(
    {
        "subprocess.Popen",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.exec",
    }
)
_unit_test_running = False


def _refuse_processes(event: str, args: tuple[object, ...]) -> None:
    if _unit_test_running and event in _PROCESS_EVENTS:
        raise RuntimeError(
            f"a unit test started a process ({event}: {str(args)[:200]}); tests that start "
            "processes belong in tests/integration"
        )


sys.addaudithook(_refuse_processes)  # for the whole run: an audit hook cannot be removed


def _is_unit_test(item: pytest.Item) -> bool:
    tests = Path(__file__).parent
    return any(item.path.is_relative_to(tests / tier) for tier in UNIT_TIERS)


def _no_processes_in_unit_tests(item: pytest.Item) -> Generator[None, None, None]:
    global _unit_test_running
    _unit_test_running = _is_unit_test(item)
    try:
        yield
    finally:
        _unit_test_running = False


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, None, None]:
    yield from _no_processes_in_unit_tests(item)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    yield from _no_processes_in_unit_tests(item)


# Session resources that cost several JVMs: under pytest-xdist (`make test` runs workers in
# parallel, `--dist loadgroup`), the tests that use one run on one worker, which alone starts it.
# tryfirst: xdist's worker reads the groups in its own hook of the same name, so the marks must be
# on the items before it runs (tests/integration/test_suite_grouping.py).
_ONE_WORKER = {
    "kafka_cluster_session": "cluster",
    "kafka_secure_broker": "secure",
    "postgres_dsn": "postgres",
}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "postgres_dsn" in fixtures:
            item.add_marker(pytest.mark.postgres)
        groups = sorted({g for name, g in _ONE_WORKER.items() if name in fixtures})
        if groups:
            item.add_marker(pytest.mark.xdist_group("+".join(groups)))


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    pytest.importorskip(
        "psycopg", reason="psycopg is not installed: pip install 'kafka-weir[postgres]'"
    )
    if not os.environ.get(ENV_DSN):
        try:
            find_postgres_bindir()
        except PostgresNotFoundError as exc:
            pytest.skip(str(exc))
    with postgres_for_tests() as dsn:
        yield dsn


@pytest.fixture
def occupied_port() -> Iterator[int]:
    """A loopback port something listens on for the test's duration."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        yield listener.getsockname()[1]


@pytest.fixture
def toolchain(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An otherwise empty PATH (the directory returned, for stand-ins of java and mvn), no
    JAVA_HOME and an empty jar cache."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("WEIR_CACHE_DIR", str(tmp_path / "cache"))
    return path


@pytest.fixture
def members() -> Iterator[list[GroupConsumer]]:
    """Members a test started (it appends them): stopped, then joined, after the test."""
    started: list[GroupConsumer] = []
    yield started
    for gc in started:
        gc.stop()
    for gc in started:
        with contextlib.suppress(Exception):
            gc.join(10)


@pytest.fixture
def held_workdir(tmp_path: Path) -> Iterator[WorkdirLock]:
    """The lock on `tmp_path` as a running broker holds it on its work directory."""
    lock = WorkdirLock(tmp_path)
    lock.acquire()
    yield lock
    lock.release()


@pytest.fixture
def quick_jvm(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every JVM the test starts (its own brokers, through the CLI or a child process too, and
    their storage formatting) runs with the cluster's fast-start options: C1-only JIT and the
    serial collector start a broker in about two thirds of the time on a loaded 2-core machine.
    For short-lived brokers only: the session's broker keeps the JVM's defaults."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", " ".join(FAST_START_JVM_ARGS))
