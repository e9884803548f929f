"""Java/Maven discovery and the jar cache, with fake `java`/`mvn` scripts: no JVM, no network."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from weir.testing import jars
from weir.testing.errors import JavaNotFoundError, JavaVersionError, MavenError, MavenNotFoundError

pytestmark = pytest.mark.timeout(30)


def write_script(directory: Path, name: str, body: str) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


@pytest.fixture
def bin_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An otherwise empty PATH, an empty jar cache and no JAVA_HOME."""
    path = tmp_path / "bin"
    path.mkdir()
    monkeypatch.setenv("PATH", str(path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("WEIR_CACHE_DIR", str(tmp_path / "cache"))
    return path


def fake_java(bin_dir: Path, version: str = "17.0.2") -> None:
    # Real java prints its version to stderr.
    write_script(bin_dir, "java", f"echo 'openjdk version \"{version}\" 2022-01-18' >&2\n")


def fake_mvn(bin_dir: Path, calls: Path, *, sleep: float = 0) -> None:
    write_script(
        bin_dir,
        "mvn",
        # PATH holds only our fakes; the script itself needs coreutils.
        f"""export PATH=/usr/bin:/bin
echo call >> "{calls}"
sleep {sleep}
for a in "$@"; do case "$a" in -DoutputDirectory=*) out="${{a#-DoutputDirectory=}}";; esac; done
mkdir -p "$out" && touch "$out/kafka_2.13-{jars.KAFKA_VERSION}.jar" "$out/kafka-clients.jar"
""",
    )


def call_count(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


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


def test_missing_java_is_explained(bin_dir: Path) -> None:
    with pytest.raises(JavaNotFoundError, match="No `java` on PATH") as info:
        jars.require_java()
    assert "WEIR_BOOTSTRAP_SERVERS" in str(info.value)


def test_java_home_wins_over_path(
    bin_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_bin = tmp_path / "jdk" / "bin"
    home_bin.mkdir(parents=True)
    fake_java(home_bin, "21.0.1")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jars.require_java() == str(home_bin / "java")


def test_old_java_is_rejected(bin_dir: Path) -> None:
    fake_java(bin_dir, "11.0.2")
    with pytest.raises(JavaVersionError, match=r"Java 11; Kafka .* needs Java 17"):
        jars.require_java()


def test_unreadable_java_version(bin_dir: Path) -> None:
    write_script(bin_dir, "java", "echo 'something odd' >&2\n")
    with pytest.raises(JavaVersionError, match="Could not read the Java version"):
        jars.require_java()


def test_missing_maven_without_cache(bin_dir: Path) -> None:
    fake_java(bin_dir)
    with pytest.raises(MavenNotFoundError, match="No `mvn` on PATH") as info:
        jars.ensure_kafka_jars()
    assert "WEIR_BOOTSTRAP_SERVERS" in str(info.value)


def test_maven_failure_names_maven_central_and_shows_output(bin_dir: Path) -> None:
    fake_java(bin_dir)
    write_script(
        bin_dir,
        "mvn",
        "echo '[ERROR] Could not transfer artifact org.apache.kafka:kafka_2.13:pom:4.1.1: "
        "Network is unreachable'\nexit 1\n",
    )
    with pytest.raises(MavenError) as info:
        jars.ensure_kafka_jars()
    message = str(info.value)
    assert f"Maven could not download org.apache.kafka:kafka_2.13:{jars.KAFKA_VERSION}" in message
    assert "Maven Central" in message
    assert "WEIR_BOOTSTRAP_SERVERS" in message
    assert "Network is unreachable" in message  # the tail of Maven's own output
    # Nothing half-downloaded is left to be mistaken for a cache.
    version_dir = jars.jars_dir().parent
    assert sorted(p.name for p in version_dir.iterdir()) == [".lock"]
    assert jars.cached_jars() is None


def test_maven_success_without_kafka_jar_is_a_failure(bin_dir: Path) -> None:
    fake_java(bin_dir)
    write_script(bin_dir, "mvn", "exit 0\n")
    with pytest.raises(MavenError, match="Maven could not download"):
        jars.ensure_kafka_jars()


def test_second_call_uses_the_cache_without_maven(bin_dir: Path, tmp_path: Path) -> None:
    fake_java(bin_dir)
    calls = tmp_path / "mvn-calls"
    fake_mvn(bin_dir, calls)

    first = jars.ensure_kafka_jars()
    assert call_count(calls) == 1
    assert (first / f"kafka_2.13-{jars.KAFKA_VERSION}.jar").is_file()
    assert first == tmp_path / "cache" / f"kafka-{jars.KAFKA_VERSION}" / "libs"

    (bin_dir / "mvn").unlink()
    (bin_dir / "java").unlink()  # neither tool is needed once cached
    assert jars.ensure_kafka_jars() == first
    assert call_count(calls) == 1


def test_concurrent_callers_download_once(bin_dir: Path, tmp_path: Path) -> None:
    fake_java(bin_dir)
    calls = tmp_path / "mvn-calls"
    fake_mvn(bin_dir, calls, sleep=0.5)
    results: list[Path] = []
    threads = [
        threading.Thread(target=lambda: results.append(jars.ensure_kafka_jars())) for _ in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert len(results) == 3 and len(set(results)) == 1
    assert call_count(calls) == 1


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
