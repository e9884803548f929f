"""librdkafka's own list of its settings, read from the build confluent-kafka runs on."""

from __future__ import annotations

import ctypes
import re
import tempfile
from pathlib import Path

import confluent_kafka
import pytest


def _library() -> ctypes.CDLL:
    """The librdkafka confluent-kafka runs on: the wheel's bundled copy, else the system's (by
    its soname: ctypes.util.find_library would run ldconfig, a process, in a unit test)."""
    bundled = Path(confluent_kafka.__file__).parent.parent / "confluent_kafka.libs"
    candidates = [str(p) for p in sorted(bundled.glob("librdkafka*.so*"))]
    candidates += ["librdkafka.so.1", "librdkafka.so"]
    version = confluent_kafka.libversion()[0]
    for path in candidates:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.rd_kafka_version_str.restype = ctypes.c_char_p
        if lib.rd_kafka_version_str().decode() == version:
            return lib
    pytest.skip(f"librdkafka {version} is not loadable with ctypes here")


def librdkafka_properties() -> dict[str, str]:
    """librdkafka's property table (rd_kafka_conf_properties_show): name -> description."""
    lib = _library()
    libc = ctypes.CDLL(None)  # the process's own symbols: libc's fopen and fclose among them
    libc.fopen.restype = ctypes.c_void_p
    libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    libc.fclose.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_conf_properties_show.argtypes = [ctypes.c_void_p]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "CONFIGURATION.md"
        fp = libc.fopen(str(path).encode(), b"w")
        lib.rd_kafka_conf_properties_show(fp)
        libc.fclose(fp)
        table = path.read_text()
    rows = re.findall(r"^([a-z_.0-9]+)\s*\|[^|]*\|[^|]*\|[^|]*\|[^|]*\|(.*)$", table, re.M)
    return dict(rows)
