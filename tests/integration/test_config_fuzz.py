"""Nothing typed into the settings crashes the interpreter: for every id and name (group id,
group instance id, transactional id, client id, bootstrap servers, topics and patterns,
dead-letter topic) and for `kafka` entries (librdkafka's own names and others, with text,
numbers and booleans), hypothesis draws strings with control characters, whitespace, NUL, lone
surrogates and unicode. Each either validates or is a `ValidationError`; a valid one also builds
the member's client (and the transactional producer) and subscribes to its topics.

The settings probe builds a librdkafka client, and a client that aborts (SIGABRT) or signals
itself (SIGKILL) takes the interpreter with it: the examples run in a child process, which
prints each input before it tries it, so the test names the one that killed it.
`make test` runs a few seconds' worth; `-m slow` many more, and every librdkafka setting with
every small integer and each special string.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.librdkafka import librdkafka_properties
from weir import ConsumerConfig, FailurePolicy

ROOT = Path(__file__).resolve().parents[2]
MODULE = "tests.integration.test_config_fuzz"
BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}

# What librdkafka and Kafka treat specially: C whitespace, NUL and other control characters,
# non-ASCII blanks, a lone surrogate, regex syntax, the names '.' and '..'.
SPECIAL = [
    " ", "\t", "\n", "\r", "\v", "\f", "\x00", "\x01", "\x1b", "\x7f", "\x85", "\u00a0",
    "\u2028", "\ufeff", "\ud800", "é", "日本", "^", "$", ".", "..", ".*", "{1001}", "\\", "(",
    "[", "%s", "-", "_",
]  # fmt: skip
# librdkafka settings that would reach outside the process in a fuzz run: a plugin library is
# loaded, a command run, a token fetched (the probe leaves SASL out for those, the member's
# client would not).
OUTSIDE = ("plugin.library.paths", "sasl.kerberos.kinit.cmd", "sasl.oauthbearer.token.endpoint.url")

Build = Callable[[], dict[str, Any]]


def texts(max_pieces: int = 5) -> st.SearchStrategy[str]:
    piece = st.one_of(
        st.sampled_from(SPECIAL),
        st.text(st.characters(exclude_categories=()), max_size=6),
        st.text("abcXYZ019.-_", min_size=1, max_size=8),
    )
    return st.lists(piece, max_size=max_pieces).map("".join)


def topic() -> st.SearchStrategy[str]:
    return st.one_of(texts(), texts().map(lambda s: "^" + s), texts().map(lambda s: f"^{s}.*"))


def constantly(settings_: dict[str, Any]) -> Build:
    return lambda: settings_


def dead_letter(name: str, by_topic: bool) -> Build:
    def build() -> dict[str, Any]:
        policy = FailurePolicy(final="dead_letter", dead_letter_topic=name)
        return {"failure_by_topic": {"t": policy}} if by_topic else {"failure": policy}

    return build


def kafka_entry(names: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    key = st.one_of(st.sampled_from(names), texts(3))
    value = st.one_of(
        texts(),
        st.integers(-5, 140),
        st.integers(),
        st.floats(),
        st.booleans(),
    )
    return st.dictionaries(key, value, min_size=1, max_size=3)


def fuzzed(names: list[str]) -> dict[str, st.SearchStrategy[Build]]:
    """What each fuzz run draws: a function building the settings (a FailurePolicy may refuse
    its own input)."""

    def given_(strategy: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[Build]:
        return strategy.map(constantly)

    protocol = st.sampled_from(["classic", "consumer"])
    return {
        "group_id": given_(texts().map(lambda s: {"group_id": s})),
        "group_instance_id": given_(
            st.builds(lambda s, p: {"group_instance_id": s, "group_protocol": p}, texts(), protocol)
        ),
        "transactional_id": given_(texts().map(lambda s: {"transactional_id": s})),
        "client.id": given_(texts().map(lambda s: {"kafka": {"client.id": s}})),
        "bootstrap_servers": given_(texts().map(lambda s: {"bootstrap_servers": s})),
        "topics": given_(
            st.builds(
                lambda ts, p: {"topics": ts, "group_protocol": p},
                st.lists(topic(), min_size=1, max_size=3),
                protocol,
            )
        ),
        "dead_letter_topic": st.builds(dead_letter, texts(), st.booleans()),
        "kafka": given_(
            kafka_entry([n for n in names if n not in OUTSIDE]).map(lambda k: {"kafka": k})
        ),
    }


class _Quiet:
    def log(self, level: int, msg: str, *args: object) -> None:
        pass


def attempt(name: str, build: Build) -> None:
    """Build the settings and validate them; a valid configuration also builds the member's
    client, subscribes, and builds the transactional producer. Anything but a ValidationError
    fails the run."""
    try:
        settings_ = build()
    except ValidationError:
        return
    print("TRY", name, ascii(settings_), flush=True)
    try:
        cfg = ConsumerConfig(**{**BASE, **settings_})
    except ValidationError:
        return
    if name == "kafka":
        return  # the probe built a client with them; the member's may reach outside
    conf = {k: v for k, v in cfg.librdkafka_config().items() if k != "bootstrap.servers"}
    client = confluent_kafka.Consumer({**conf, "logger": _Quiet()})
    try:
        client.subscribe(cfg.topics)
    finally:
        client.close()
    if cfg.transactional_id is not None:
        confluent_kafka.Producer({"transactional.id": cfg.transactional_id, "logger": _Quiet()})


# Inputs found to crash the interpreter once, tried first on every run: a blank group id
# (SIGABRT in confluent-kafka's Consumer()), librdkafka's termination signal set to SIGKILL or
# SIGSTOP (it signals its own threads with it on close).
KNOWN: list[tuple[str, dict[str, Any]]] = [
    *(("group_id", {"group_id": s}) for s in (" ", "\t", "\x00", "\n\r")),
    *(("kafka", {"kafka": {"internal.termination.signal": s}}) for s in (9, "19")),
]


def fuzz(examples: int, names: list[str]) -> None:
    """The child's work: the known crashers, then every fuzz run, `examples` examples each
    (derandomized: the same inputs on every run and machine)."""
    for name, known in KNOWN:
        attempt(name, constantly(known))
    for name, strategy in fuzzed(names).items():
        runner(name, strategy, examples)()


def runner(name: str, strategy: st.SearchStrategy[Build], examples: int) -> Callable[[], None]:
    @settings(
        max_examples=examples,
        derandomize=True,
        database=None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(strategy)
    def run(build: Build) -> None:
        attempt(name, build)

    return run


def sweep(names: list[str]) -> None:
    """The slow tier's exhaustive part: every librdkafka setting with every small integer and
    each special string, alone."""
    values: list[object] = [*range(-2, 130), *SPECIAL, "", "x" * 5000, 2**31, -(2**63), 1e308]
    for key in names:
        if key in OUTSIDE:
            continue
        for value in values:
            attempt("kafka", constantly({"kafka": {key: value}}))


def run_child(call: str, timeout: float) -> None:
    """Run `call` in a child process with librdkafka's setting names on stdin; fail naming the
    last input it tried if it did not exit cleanly."""
    names = sorted(librdkafka_properties())
    assert "internal.termination.signal" in names
    child = subprocess.run(
        [sys.executable, "-c", f"import json, sys\nfrom {MODULE} import fuzz, sweep\n{call}"],
        input=json.dumps(names),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    tried = [line for line in child.stdout.splitlines() if line.startswith("TRY ")]
    assert child.returncode == 0, (
        f"the child exited with {child.returncode} after {len(tried)} inputs, the last: "
        f"{tried[-1][:2000] if tried else 'none'}\n{child.stderr[-4000:]}"
    )
    assert len(tried) > 100, child.stdout[-2000:]


def test_no_id_name_or_kafka_entry_crashes_the_interpreter() -> None:
    run_child("fuzz(40, json.load(sys.stdin))", timeout=240)


@pytest.mark.slow
def test_no_id_name_or_kafka_entry_crashes_the_interpreter_at_length() -> None:
    run_child("fuzz(3000, json.load(sys.stdin))", timeout=3600)


@pytest.mark.slow
def test_no_librdkafka_setting_crashes_the_interpreter_with_any_small_value() -> None:
    run_child("sweep(json.load(sys.stdin))", timeout=3600)
