"""Locate Java and Maven, and fetch the Kafka broker's jars from Maven Central once per machine.

We run the broker from Maven Central jars rather than the Apache tarball because Maven already knows
how to download, verify and cache artifacts, behind whatever proxy/mirror the user's settings.xml
names; a tarball would need our own downloader, checksum handling and mirror support.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

from weir.logs import get_logger
from weir.testing.errors import JavaNotFoundError, JavaVersionError, MavenError, MavenNotFoundError

log = get_logger(__name__)

# Kafka 4.1.1: the KIP-848 consumer group protocol is GA on the broker since 4.0, and 4.1.x is the
# widely deployed line (Confluent Platform 8.1 ships it), so tests exercise what users run. The
# 4.x broker needs Java 17, which is also what our CI machines have.
KAFKA_VERSION = "4.1.1"
"""The Apache Kafka version the embedded broker runs unless `kafka_version=` says another."""
MIN_JAVA_MAJOR = 17

MAVEN_TIMEOUT_S = 600.0
JAVA_VERSION_TIMEOUT_S = 30.0
_COMPLETE_MARKER = ".weir-complete"
_TAIL_LINES = 25


def cache_root() -> Path:
    """Where the harness caches things: $WEIR_CACHE_DIR, $XDG_CACHE_HOME/weir or ~/.cache/weir."""
    explicit = os.environ.get("WEIR_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "weir"


def find_java() -> str:
    """Path of the java executable: $JAVA_HOME/bin/java if set, else the first on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        if os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("java")
    if found is None:
        raise JavaNotFoundError(
            f"No `java` on PATH. The embedded Kafka broker needs Java {MIN_JAVA_MAJOR}+ "
            "(e.g. `apt-get install openjdk-17-jre-headless`), or set WEIR_BOOTSTRAP_SERVERS to "
            "use an existing cluster."
        )
    return found


def parse_java_major(version_output: str) -> int | None:
    """Major version from `java -version` output; handles both `1.8.0_292` and `17.0.15` styles."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def require_java() -> str:
    """Path of a java that is recent enough for the broker, or a clear error."""
    java = find_java()
    try:
        # `java -version` writes to stderr, not stdout.
        result = subprocess.run(
            [java, "-version"],
            capture_output=True,
            text=True,
            timeout=JAVA_VERSION_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JavaNotFoundError(f"Could not run `{java} -version`: {exc}") from exc
    output = result.stderr + result.stdout
    major = parse_java_major(output)
    if major is None:
        raise JavaVersionError(f"Could not read the Java version from `{java} -version`:\n{output}")
    if major < MIN_JAVA_MAJOR:
        raise JavaVersionError(
            f"{java} is Java {major}; Kafka {KAFKA_VERSION} needs Java {MIN_JAVA_MAJOR} or newer. "
            "Install a newer JDK/JRE (or point JAVA_HOME at one), or set WEIR_BOOTSTRAP_SERVERS "
            "to use an existing cluster."
        )
    return java


def find_maven() -> str:
    found = shutil.which("mvn")
    if found is None:
        raise MavenNotFoundError(
            "No `mvn` on PATH, and the Kafka jars are not cached yet. Install Maven 3.6+ "
            "(e.g. `apt-get install maven`) so the harness can fetch "
            f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION} once, or set WEIR_BOOTSTRAP_SERVERS to "
            "use an existing cluster."
        )
    return found


def jars_dir(version: str = KAFKA_VERSION) -> Path:
    return cache_root() / f"kafka-{version}" / "libs"


def cached_jars(version: str = KAFKA_VERSION) -> Path | None:
    """The jar directory if a previous download completed, else None. Never runs anything."""
    libs = jars_dir(version)
    return libs if (libs / _COMPLETE_MARKER).is_file() else None


def ensure_kafka_jars(version: str = KAFKA_VERSION, *, timeout: float = MAVEN_TIMEOUT_S) -> Path:
    """Directory holding the broker's runtime classpath; downloaded with Maven the first time."""
    done = cached_jars(version)
    if done is not None:
        return done
    libs = jars_dir(version)
    libs.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(libs.parent / ".lock"):
        # Another process may have finished the download while we waited for the lock.
        done = cached_jars(version)
        if done is not None:
            return done
        require_java()  # Maven itself needs Java; say so before Maven says something vaguer.
        mvn = find_maven()
        tmp = Path(tempfile.mkdtemp(prefix="libs.tmp-", dir=libs.parent))
        try:
            _run_maven(mvn, version, tmp, timeout)
            (tmp / _COMPLETE_MARKER).write_text(version + "\n")
            # A libs/ without the marker is debris from an older, interrupted layout: replace it.
            if libs.exists():
                shutil.rmtree(libs)
            # rename() is atomic, so readers see either no libs/ or a complete one.
            tmp.rename(libs)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    log.info("kafka_jars_ready", version=version, path=str(libs))
    return libs


@contextlib.contextmanager
def _exclusive_lock(path: Path) -> Iterator[None]:
    # flock, not a lock file's existence, so a crashed holder cannot leave the lock behind.
    with path.open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _run_maven(mvn: str, version: str, output_dir: Path, timeout: float) -> None:
    log.info("kafka_jars_downloading", version=version, into=str(output_dir))
    with (
        tempfile.TemporaryDirectory(prefix="weir-pom-") as pom_dir,
        resources.as_file(resources.files("weir.testing") / "pom.xml") as packaged_pom,
    ):
        # Maven writes target/ next to the pom: give it a scratch copy, never the installed package.
        pom = Path(pom_dir) / "pom.xml"
        shutil.copyfile(packaged_pom, pom)
        command = [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            "dependency:copy-dependencies",
            "-DincludeScope=runtime",
            f"-DoutputDirectory={output_dir}",
            f"-Dkafka.version={version}",
        ]
        try:
            result = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise MavenError(
                f"Maven did not finish downloading org.apache.kafka:kafka_2.13:{version} within "
                f"{timeout:.0f} s; check network access to Maven Central or set "
                "WEIR_BOOTSTRAP_SERVERS to use an existing cluster."
            ) from exc
    if result.returncode != 0 or not any(output_dir.glob(f"kafka_2.13-{version}.jar")):
        output = (result.stdout + result.stderr).strip().splitlines()
        tail = "\n".join(output[-_TAIL_LINES:])
        raise MavenError(
            f"Maven could not download org.apache.kafka:kafka_2.13:{version}; check network access "
            "to Maven Central or set WEIR_BOOTSTRAP_SERVERS to use an existing cluster.\n"
            f"`{' '.join(command)}` exited with {result.returncode}:\n{tail}"
        )
