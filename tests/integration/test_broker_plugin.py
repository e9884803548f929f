"""The pytest plugin in a user's project: marks fixture users and starts nothing by itself."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)


def run_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # A separate directory without weir's pyproject: only the entry-point plugin registers markers.
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--strict-markers", *args],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_fixture_users_are_marked_so_they_can_be_deselected(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import pytest

            def test_topic(make_topic):
                raise AssertionError("must be deselected")

            def test_cluster(kafka_cluster):
                raise AssertionError("must be deselected")

            @pytest.mark.broker
            def test_marked_by_hand():
                raise AssertionError("must be deselected")

            def test_plain():
                pass
            """
        )
    )
    result = run_pytest(tmp_path, "-m", "not broker and not cluster")
    assert "1 passed, 3 deselected" in result.stdout, result.stdout + result.stderr


def test_plugin_import_starts_nothing(tmp_path: Path) -> None:
    (tmp_path / "test_user.py").write_text(
        textwrap.dedent(
            """
            import sys

            def test_nothing_heavy_loaded():
                assert "weir.testing.pytest_plugin" in sys.modules
                assert "weir.testing.broker" not in sys.modules
            """
        )
    )
    result = run_pytest(tmp_path)
    assert "1 passed" in result.stdout, result.stdout + result.stderr
