"""The benchmarks' `--separate-cores`: the broker's threads on one CPU, the benchmark's on the
others, and both as they were afterwards (a long-lived broker given by `--broker-pid` must not
stay pinned)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import _common

pytestmark = pytest.mark.skipif(
    len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs to separate"
)


@pytest.fixture
def other_process() -> Iterator[subprocess.Popen[bytes]]:
    """A process with a second thread, standing in for the broker's JVM."""
    code = "import threading, time; threading.Thread(target=time.sleep, args=(60,)).start(); "
    code += "print('up', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"up\n"
    yield proc
    proc.kill()
    proc.wait()


# Each thread's CPUs; the test process's other threads (of earlier tests) may end meanwhile,
# and are left out then.
masks = _common._affinities


def now(tids: Iterable[int]) -> dict[int, set[int]]:
    """The CPUs of those of `tids` still running."""
    return {tid: m for tid, m in masks(os.getpid()).items() if tid in tids}


def test_the_broker_and_this_process_get_cpus_of_their_own_and_them_back(
    other_process: subprocess.Popen[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_common, "SEPARATE_CORES", {})
    cpus = sorted(os.sched_getaffinity(0))
    broker_before, own_before = masks(other_process.pid), masks(os.getpid())
    started_inside: list[set[int]] = []
    with _common._separated(other_process.pid):
        assert list(masks(other_process.pid).values()) == [{cpus[0]}, {cpus[0]}]
        assert all(m == set(cpus[1:]) for m in masks(os.getpid()).values())
        t = threading.Thread(target=lambda: started_inside.append(os.sched_getaffinity(0)))
        t.start()
        t.join()
    assert started_inside == [set(cpus[1:])]  # a thread the benchmark starts follows it
    assert masks(other_process.pid) == broker_before
    after = now(own_before)
    assert after == {tid: own_before[tid] for tid in after}
    # The results say where the run ran.
    _common.write_json(str(tmp_path / "out.json"), {"environment": _common.environment()})
    written = json.loads((tmp_path / "out.json").read_text())
    assert written["environment"]["separate_cores"] == {"broker": cpus[:1], "own": cpus[1:]}


def test_nothing_moves_without_a_broker_process(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_common, "SEPARATE_CORES", {})
    before = masks(os.getpid())
    with _common._separated(None):
        after = now(before)
        assert after == {tid: before[tid] for tid in after}
    data: dict[str, Any] = {"environment": {}}
    _common.write_json(None, data)
    assert data["environment"]["separate_cores"] is None


def test_an_attached_broker_needs_its_pid() -> None:
    with (
        pytest.raises(SystemExit, match="needs --broker-pid"),
        _common.broker("127.0.0.1:9", separate_cores=True),
    ):
        pass
