"""One broker per work directory: the directory's lock, without starting a broker or any other
process. What the broker JVM does with the lock it inherits is in
tests/integration/test_broker_workdir_lock.py (a stand-in) and
tests/integration/test_broker_lifecycle.py (the real one, through `weir broker`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weir.testing.broker import WorkdirLock, resolve_workdir
from weir.testing.errors import WorkdirError, WorkdirInUseError

pytestmark = pytest.mark.timeout(30)


def test_a_second_lock_is_refused_at_once_and_names_the_holder(
    tmp_path: Path, held_workdir: WorkdirLock
) -> None:
    held_workdir.record(pid=4242, bootstrap_servers="127.0.0.1:9092")
    with pytest.raises(WorkdirInUseError) as info:
        WorkdirLock(tmp_path).acquire()
    assert str(info.value) == (
        f"another broker runs on {tmp_path} (at 127.0.0.1:9092, pid 4242): stop it first, "
        "or use another directory"
    )
    held_workdir.release()
    again = WorkdirLock(tmp_path)
    again.acquire()  # released: free again
    again.release()


def test_a_holder_still_starting_is_named_by_its_launcher(
    tmp_path: Path, held_workdir: WorkdirLock
) -> None:
    with pytest.raises(WorkdirInUseError, match=rf"\(starting, launched by pid {os.getpid()}\)"):
        WorkdirLock(tmp_path).acquire()


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
