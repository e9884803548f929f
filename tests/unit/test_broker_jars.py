"""Java/Maven discovery and the jar cache, running nothing (the stand-in `java` and `mvn`
scripts run in tests/integration/test_broker_jars.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from weir.testing import jars
from weir.testing.errors import JavaNotFoundError

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_292"', 8),
        ('openjdk version "11.0.2" 2019-01-15', 11),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "22-ea" 2024-03-19', 22),
        ("no version here", None),
    ],
)
def test_parse_java_major(output: str, major: int | None) -> None:
    assert jars.parse_java_major(output) == major


def test_missing_java_is_explained(toolchain: Path) -> None:
    with pytest.raises(JavaNotFoundError, match="No `java` on PATH") as info:
        jars.require_java()
    assert "WEIR_BOOTSTRAP_SERVERS" in str(info.value)


def test_cache_dir_resolution(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("WEIR_CACHE_DIR", str(tmp_path / "explicit"))
    assert jars.cache_root() == tmp_path / "explicit"
    monkeypatch.delenv("WEIR_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert jars.cache_root() == tmp_path / "xdg" / "weir"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert jars.cache_root() == tmp_path / "home" / ".cache" / "weir"


def test_real_cache_is_reused_without_maven(monkeypatch: pytest.MonkeyPatch) -> None:
    """If this machine already has the jars, a PATH without mvn still works (no download)."""
    cached = jars.cached_jars()
    if cached is None:
        pytest.skip("Kafka jars not cached on this machine yet")
    monkeypatch.setenv("PATH", os.devnull)
    assert jars.ensure_kafka_jars() == cached
