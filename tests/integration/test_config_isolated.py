"""Configuration checks that need an interpreter of their own: ids and signals that aborted,
killed or stopped it (a crash must end a child, not the test run), and the threads 60 checks
leave behind (the suite's own process runs clients of other tests that start and end threads
at any moment)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.processes import run_python

pytestmark = pytest.mark.timeout(120)

BASE: dict[str, Any] = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}
ID_RULE = "does not start with whitespace and has no NUL character"


def refusals_in_a_child(settings: list[dict[str, Any]]) -> list[str]:
    """Each of `settings` validated in a child process, which a crash kills instead of this one:
    the first error's message of each, or "valid"."""
    code = (
        "import sys\n"
        "from pydantic import ValidationError\n"
        "from weir import ConsumerConfig\n"
        f"for settings in {settings!r}:\n"
        "    try:\n"
        f"        ConsumerConfig(**{{**{BASE!r}, **settings}})\n"
        "        print('valid', flush=True)\n"
        "    except ValidationError as exc:\n"
        "        print(exc.errors()[0]['msg'].replace('\\n', ' '), flush=True)\n"
    )
    child = run_python(code)
    done = child.stdout.splitlines()
    assert child.returncode == 0, (
        f"exit {child.returncode} on {settings[len(done)]!r}: {child.stderr[-500:]}"
    )
    return done


BLANK_IDS = [" ", "\t", "\x00", "\n", "  \r\n", "\x00orders"]


def test_a_blank_group_id_is_a_validation_error_not_an_aborted_interpreter() -> None:
    # librdkafka strips leading whitespace and ends a string at NUL: the group id was empty to
    # it, the consumer had no group, and confluent-kafka's Consumer() failed an assertion
    # (SIGABRT).
    said = refusals_in_a_child([{"group_id": g} for g in BLANK_IDS])
    assert len(said) == len(BLANK_IDS)
    assert all(m.startswith("Value error, group_id") and ID_RULE in m for m in said), said


def test_librdkafka_may_not_take_over_a_signal() -> None:
    # Building the throwaway client with 9 killed the interpreter (SIGKILL at close), with 19
    # stopped it, and with 2 left Ctrl-C doing nothing for the rest of the process.
    signals: list[int | str] = [2, 15, 10, 9, "19"]
    said = refusals_in_a_child([{"kafka": {"internal.termination.signal": s}} for s in signals])
    assert len(said) == len(signals)
    assert all("kafka['internal.termination.signal'] must stay 0" in m for m in said), said


# In a fresh interpreter: in the suite's own process, clients of earlier tests (a producer being
# garbage-collected, a consumer still retrying a stopped broker) start and end librdkafka threads
# of their own at any moment, and a count of the process's threads then says nothing about the
# check's.
_THREAD_COUNT = """
import psutil, pydantic
from weir import ConsumerConfig
BASE = {"bootstrap_servers": "broker:9092", "group_id": "g", "topics": ["t"]}
ConsumerConfig(**BASE)  # librdkafka's one-time global set-up, before the count
process = psutil.Process()
before = process.num_threads()
for i in range(20):
    ConsumerConfig(**BASE, kafka={"client.id": f"c{i}"})
    ConsumerConfig(**BASE, group_protocol="consumer", kafka={"security.protocol": "ssl"})
    try:
        ConsumerConfig(**BASE, kafka={"fetch.min.bytes": 0})
    except pydantic.ValidationError:
        pass
    else:
        raise SystemExit("fetch.min.bytes=0 was accepted")
print(before, process.num_threads())
"""


def test_the_check_leaves_no_thread_behind() -> None:
    done = run_python(_THREAD_COUNT, timeout=120)
    assert done.returncode == 0, done.stderr
    before, after = map(int, done.stdout.split())
    assert after == before, f"{after - before} threads left behind by 60 checks"
