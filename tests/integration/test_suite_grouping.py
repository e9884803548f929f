"""`make test` runs the suite on pytest-xdist workers with `--dist loadgroup`, and tests/conftest.py
groups the tests of a costly session resource (the secured broker, the cluster, PostgreSQL) so
one worker alone starts it. When the grouping silently stops working, every worker starts its own
secured broker, with nothing failing: this test fails instead. Seen twice: the conftest's hook
ran after xdist's, which reads the groups (fixed with tryfirst), and pytest 9.2 ignores the
node-id suffix xdist 3.8 writes for them (pytest-dev/pytest-xdist#1386; pyproject holds pytest
below 9.2)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
import pytest

pytest_plugins = ["tests.conftest"]


@pytest.fixture(scope="session")
def kafka_secure_broker() -> str:
    return "a stand-in: only the fixture's name decides the group"
"""

TESTS = """
import pytest


@pytest.mark.parametrize("n", range(4))
def test_secured(kafka_secure_broker: str, n: int) -> None:
    pass


@pytest.mark.parametrize("n", range(4))
def test_plain(n: int) -> None:
    pass
"""


def test_the_tests_of_one_costly_resource_run_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    for name in ("test_a.py", "test_b.py"):
        (tmp_path / name).write_text(textwrap.dedent(TESTS))
    xdist = ("-n", "2", "--dist", "loadgroup")  # as `make test` runs the suite
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", *xdist],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=80,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) == 16, done.stdout
    secured = {(worker, test) for worker, test in ran if "test_secured" in test}
    modules = ("test_a.py", "test_b.py")
    expected = {f"{module}::test_secured[{n}]@secure" for module in modules for n in range(4)}
    assert {test for _, test in secured} == expected, done.stdout
    assert len({worker for worker, _ in secured}) == 1, done.stdout
