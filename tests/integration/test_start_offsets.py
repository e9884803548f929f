"""Where a new partition starts, on the broker: a member that resolved `auto_offset_reset`
commits that position before it hands out a record, so a successor never resolves it again.

Regression (issue 23.2): a member joined a new group at the log end (`latest`), was handed 100
records, handled 28 and was SIGKILLed before its first commit (`commit_interval_s=30`); the
next owner found nothing committed, reset to `latest` again and committed past the other 72.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from tests.consumer_overrides import GroupProtocol
from tests.integration.kafka_helpers import committed, produce, wait_until
from weir.testing.pytest_plugin import TopicFactory

pytestmark = [pytest.mark.broker, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
# The checkout's own weir, whatever the environment has installed.
PYTHONPATH = os.pathsep.join([str(REPO / "src"), str(REPO)])

# One member in its own process: writes each handled offset to a file (one JSON line each),
# and after `stall_after` records stalls every handler for good (the process is SIGKILLed).
MEMBER = textwrap.dedent(
    """
    import json, sys, threading, time
    from weir import GroupConsumer, Record

    bootstrap, group, topic, protocol, reset, out, stall_after = sys.argv[1:8]
    stall_after = int(stall_after)
    lock = threading.Lock()
    handled = []

    def handle(record: Record) -> None:
        with lock:
            if stall_after and len(handled) >= stall_after:
                stall = True
            else:
                stall = False
                handled.append(record.offset)
                with open(out, "a") as f:
                    f.write(json.dumps(record.offset) + "\\n")
        if stall:
            time.sleep(3600)

    # Classic: a killed member's partitions move after its session timeout (45 s by default).
    timeouts = {}
    if protocol == "classic":
        timeouts = {"session_timeout_s": 6.0, "heartbeat_interval_s": 1.0}
    gc = GroupConsumer(
        handle,
        bootstrap_servers=bootstrap,
        group_id=group,
        topics=[topic],
        group_protocol=protocol,
        **timeouts,
        auto_offset_reset=reset,
        commit_interval_s=30.0,
        commit_every_records=1_000_000,
        ordering="partition",
        workers=1,
    )
    gc.start()
    # Assigned, and fetching (a start still being settled pauses the partition).
    while not gc.stats().partitions or any(p.paused for p in gc.stats().partitions):
        time.sleep(0.05)
    with open(out + ".started", "w") as f:
        f.write("started")
    gc.join()
    """
)


def _start(
    tmp: Path,
    name: str,
    bootstrap: str,
    group: str,
    topic: str,
    protocol: str,
    reset: str,
    stall_after: int,
) -> tuple[subprocess.Popen[bytes], Path]:
    out = tmp / f"{name}.jsonl"
    out.touch()
    log = (tmp / f"{name}.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", MEMBER, bootstrap, group, topic, protocol, reset, str(out),
         str(stall_after)],
        cwd=REPO, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": PYTHONPATH},
    )  # fmt: skip
    return proc, out


def _handled(path: Path) -> list[int]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_a_member_killed_before_its_first_commit_leaves_its_start_committed(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, protocol: GroupProtocol
) -> None:
    topic = make_topic(1)
    produce(kafka_bootstrap, topic, [(None, b"old-%d" % i) for i in range(50)])  # before: skipped
    group = f"g-{uuid.uuid4().hex[:10]}"
    first, first_out = _start(
        tmp_path, "first", kafka_bootstrap, group, topic, protocol, "latest", stall_after=28
    )
    try:
        wait_until(lambda: (tmp_path / "first.jsonl.started").exists(), 60, "the first member")
        # Where it starts (the log end, `latest`) is settled once it committed it.
        wait_until(
            lambda: committed(kafka_bootstrap, group, topic, 1) == [50], 30, "the start committed"
        )
        produce(kafka_bootstrap, topic, [(None, b"new-%d" % i) for i in range(100)])
        wait_until(lambda: len(_handled(first_out)) >= 28, 60, "28 records handled")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    assert _handled(first_out) == list(range(50, 78))
    start = committed(kafka_bootstrap, group, topic, 1)

    second, second_out = _start(
        tmp_path, "second", kafka_bootstrap, group, topic, protocol, "latest", stall_after=0
    )
    try:
        wait_until(lambda: len(_handled(second_out)) >= 100, 90, "the second member's records")
        time.sleep(0.5)
    finally:
        second.send_signal(signal.SIGKILL)
        second.wait(10)
    assert _handled(second_out) == list(range(50, 150)), "the successor starts where it did"
    assert start == [50], "the first member committed where it joined, and nothing after it"
