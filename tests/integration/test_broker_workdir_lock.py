"""One broker per work directory, with processes: a stand-in "java" (a shell script that sleeps)
shows what the broker JVM does with the lock it inherits (tests/integration/test_broker_lifecycle.py
runs the real one through `weir broker`), and a broker refused a locked directory has run
`java -version` first."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.stand_ins import write_script
from weir.testing.broker import EmbeddedKafka, KafkaNode, WorkdirLock
from weir.testing.cluster import EmbeddedKafkaCluster
from weir.testing.errors import WorkdirInUseError

pytestmark = pytest.mark.timeout(30)


def sleeping_java(tmp_path: Path) -> str:
    """An executable that stands for java: it ignores its arguments and sleeps."""
    (tmp_path / "bin").mkdir()
    return str(write_script(tmp_path / "bin", "java", "exec sleep 60\n"))


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
        java=sleeping_java(tmp_path),
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
    tmp_path: Path, held_workdir: WorkdirLock
) -> None:
    """(The start runs `java -version` before it takes the lock.)

    Regression: a second broker on a running one's directory rewrote its server.properties
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
