"""The orders demo says it downloads the Kafka jars only when it will (what the demos print on a
machine without Java: tests/integration/test_demo_set_up.py)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from examples.orders.__main__ import start_broker
from rich.console import Console

from weir.testing import jars
from weir.testing.errors import JavaNotFoundError

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(30)


def demo_start_output(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    """What the demo prints before starting its broker; stopped early by a PATH without java."""
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    out = io.StringIO()
    with contextlib.ExitStack() as stack, pytest.raises(JavaNotFoundError):
        start_broker(Console(file=out, width=200), stack)
    return out.getvalue()


def test_cached_jars_are_not_announced_as_a_download(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Regression: "the first run downloads its jars" was printed on every run."""
    cache = tmp_path / "cache"
    libs = cache / f"kafka-{jars.KAFKA_VERSION}" / "libs"
    libs.mkdir(parents=True)
    (libs / ".weir-complete").write_text(jars.KAFKA_VERSION)
    monkeypatch.setenv("WEIR_CACHE_DIR", str(cache))
    assert jars.cached_jars() == libs
    output = demo_start_output(monkeypatch, tmp_path)
    assert "starting embedded Kafka" in output
    assert "download" not in output.lower()


def test_a_download_is_announced(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEIR_CACHE_DIR", str(tmp_path / "empty-cache"))
    output = demo_start_output(monkeypatch, tmp_path)
    assert "downloading the Kafka jars" in output
