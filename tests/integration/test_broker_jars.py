"""Java/Maven discovery and the jar cache, with stand-in `java`/`mvn` scripts: no JVM, no
network."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.stand_ins import fake_java, fake_mvn, write_script
from weir.testing import jars
from weir.testing.errors import JavaVersionError, MavenError, MavenNotFoundError

pytestmark = pytest.mark.timeout(30)


def call_count(calls: Path) -> int:
    return len(calls.read_text().splitlines()) if calls.exists() else 0


def test_java_home_wins_over_path(
    toolchain: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home_bin = tmp_path / "jdk" / "bin"
    home_bin.mkdir(parents=True)
    fake_java(home_bin, "21.0.1")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "jdk"))
    assert jars.require_java() == str(home_bin / "java")


def test_old_java_is_rejected(toolchain: Path) -> None:
    fake_java(toolchain, "11.0.2")
    with pytest.raises(JavaVersionError, match=r"Java 11; Kafka .* needs Java 17"):
        jars.require_java()


def test_unreadable_java_version(toolchain: Path) -> None:
    write_script(toolchain, "java", "echo 'something odd' >&2\n")
    with pytest.raises(JavaVersionError, match="Could not read the Java version"):
        jars.require_java()


def test_missing_maven_without_cache(toolchain: Path) -> None:
    fake_java(toolchain)
    with pytest.raises(MavenNotFoundError, match="No `mvn` on PATH") as info:
        jars.ensure_kafka_jars()
    assert "WEIR_BOOTSTRAP_SERVERS" in str(info.value)


def test_maven_failure_names_maven_central_and_shows_output(toolchain: Path) -> None:
    fake_java(toolchain)
    write_script(
        toolchain,
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


def test_maven_success_without_kafka_jar_is_a_failure(toolchain: Path) -> None:
    fake_java(toolchain)
    write_script(toolchain, "mvn", "exit 0\n")
    with pytest.raises(MavenError, match="Maven could not download"):
        jars.ensure_kafka_jars()


def test_second_call_uses_the_cache_without_maven(toolchain: Path, tmp_path: Path) -> None:
    fake_java(toolchain)
    calls = tmp_path / "mvn-calls"
    fake_mvn(toolchain, calls)

    first = jars.ensure_kafka_jars()
    assert call_count(calls) == 1
    assert (first / f"kafka_2.13-{jars.KAFKA_VERSION}.jar").is_file()
    assert first == tmp_path / "cache" / f"kafka-{jars.KAFKA_VERSION}" / "libs"

    (toolchain / "mvn").unlink()
    (toolchain / "java").unlink()  # neither tool is needed once cached
    assert jars.ensure_kafka_jars() == first
    assert call_count(calls) == 1


def test_concurrent_callers_download_once(toolchain: Path, tmp_path: Path) -> None:
    fake_java(toolchain)
    calls = tmp_path / "mvn-calls"
    fake_mvn(toolchain, calls, sleep=0.5)
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
