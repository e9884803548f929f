"""Shell scripts that stand for java or mvn: what the harness finds and runs, without a JVM or
a network."""

from __future__ import annotations

import stat
from pathlib import Path

from weir.testing import jars


def write_script(directory: Path, name: str, body: str) -> Path:
    """An executable `directory/name` running `body` with /bin/sh."""
    path = directory / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
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
