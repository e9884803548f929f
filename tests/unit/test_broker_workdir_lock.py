"""One broker per work directory: the directory's lock, without starting a broker.

A stand-in "java" (a shell script that sleeps) shows what the broker JVM does with the lock it
inherits; tests/integration/test_broker_lifecycle.py runs the real one through `weir broker`.
"""

from __future__ import annotations

import os
import signal
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from weir.testing.broker import EmbeddedKafka, KafkaNode, WorkdirLock, resolve_workdir
from weir.testing.cluster import EmbeddedKafkaCluster
from weir.testing.errors import WorkdirError, WorkdirInUseError

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def held(tmp_path: Path) -> Iterator[WorkdirLock]:
    lock = WorkdirLock(tmp_path)
    lock.acquire()
    yield lock
    lock.release()


def test_a_second_lock_is_refused_at_once_and_names_the_holder(
    tmp_path: Path, held: WorkdirLock
) -> None:
    held.record(pid=4242, bootstrap_servers="127.0.0.1:9092")
    with pytest.raises(WorkdirInUseError) as info:
        WorkdirLock(tmp_path).acquire()
    assert str(info.value) == (
        f"another broker runs on {tmp_path} (at 127.0.0.1:9092, pid 4242): stop it first, "
        "or use another directory"
    )
    held.release()
    again = WorkdirLock(tmp_path)
    again.acquire()  # released: free again
    again.release()


def test_a_holder_still_starting_is_named_by_its_launcher(
    tmp_path: Path, held: WorkdirLock
) -> None:
    with pytest.raises(WorkdirInUseError, match=rf"\(starting, launched by pid {os.getpid()}\)"):
        WorkdirLock(tmp_path).acquire()


def fake_java(tmp_path: Path) -> str:
    """An executable that stands for java: it ignores its arguments and sleeps."""
    script = tmp_path / "bin" / "java"
    script.parent.mkdir()
    script.write_text("#!/bin/sh\nexec sleep 60\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


def test_the_launched_jvm_keeps_the_lock_after_its_launcher_lets_go(tmp_path: Path) -> None:
    """What `weir broker start` relies on: it exits, and its detached broker holds the lock
    until the broker dies, however it dies (here: SIGKILL)."""
    workdir = tmp_path / "work"
    workdir.mkdir()
    lock = WorkdirLock(workdir)
    lock.acquire()
    node = KafkaNode(
        node_id=1,
        workdir=workdir,
        port=1,
        controller_port=2,
        quorum={},
        properties={},
        java=fake_java(tmp_path),
        jars=tmp_path,
        die_with_parent=False,
        lock=lock,
    )
    node.write_config()
    node.launch()
    try:
        lock.release()  # the launcher is gone
        with pytest.raises(WorkdirInUseError):
            WorkdirLock(workdir).acquire()
        assert node.pid is not None
        os.kill(node.pid, signal.SIGKILL)
        node.kill()  # reaps it
        after = WorkdirLock(workdir)
        after.acquire()  # no stale lock left behind by the killed holder
        after.release()
    finally:
        node.kill()


def test_a_broker_on_a_locked_dir_fails_before_touching_it(
    tmp_path: Path, held: WorkdirLock
) -> None:
    """Regression: a second broker on a running one's directory rewrote its server.properties
    (the next restart took the wrong ports) before Kafka's own lock stopped the second JVM;
    with keep=False it would also have deleted the directory on its way out."""
    (tmp_path / "server.properties").write_text("listeners=PLAINTEXT://127.0.0.1:1234\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    with pytest.raises(WorkdirInUseError, match="another broker runs on"):
        EmbeddedKafka(workdir=tmp_path, keep=False).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "server.properties").read_text() == "listeners=PLAINTEXT://127.0.0.1:1234\n"
    with pytest.raises(WorkdirInUseError):
        EmbeddedKafkaCluster(size=1, workdir=tmp_path, keep=False).start()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_an_unusable_work_directory_is_one_clear_error(tmp_path: Path) -> None:
    """Regression: a --dir that is a file ended `weir broker start` with a FileExistsError
    traceback."""
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    with pytest.raises(WorkdirError, match="a-file as a work directory: it is not a directory"):
        resolve_workdir(a_file, None, "x")
    with pytest.raises(WorkdirError, match="/proc/weir-nowhere as a work directory: No such file"):
        resolve_workdir("/proc/weir-nowhere", None, "x")
    # Not writable, even by root: where the lock file cannot be made, no broker starts.
    with pytest.raises(WorkdirError, match="cannot use /sys as a work directory: Permission"):
        WorkdirLock(Path("/sys")).acquire()
