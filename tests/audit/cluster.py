"""Start, stop, kill and freeze audited member processes; feed them a steady stream of records."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from tests.audit import check, read
from tests.integration.kafka_helpers import committed, end_offsets

REPO = Path(__file__).resolve().parents[2]


class Members:
    def __init__(
        self, workdir: Path, bootstrap: str, group: str, topic: str, protocol: str
    ) -> None:
        self.workdir = workdir
        self.group = group
        self.common = [
            "--bootstrap",
            bootstrap,
            "--group",
            group,
            "--topic",
            topic,
            "--protocol",
            protocol,
        ]
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def audit_files(self) -> list[Path]:
        return sorted(self.workdir.glob("audit-*.jsonl"))

    def events(self) -> list[dict[str, Any]]:
        return read(self.audit_files())

    def command(self, name: str, *extra: str) -> list[str]:
        """The command line of member `name`."""
        return [
            sys.executable,
            "-m",
            "tests.audit.member",
            *self.common,
            "--member",
            name,
            "--audit",
            str(self.workdir / f"audit-{name}.jsonl"),
            *extra,
        ]

    def start(self, name: str, *extra: str, netns: str | None = None) -> None:
        """Start member `name`; with `netns`, inside that network namespace (tests/audit/network.py;
        `ip netns exec` execs Python in place, so signals reach the member)."""
        log = (self.workdir / f"{name}.log").open("ab")
        cmd = [
            *(["ip", "netns", "exec", netns] if netns is not None else []),
            *self.command(name, *extra),
        ]
        self.procs[name] = subprocess.Popen(
            cmd, cwd=REPO, stdout=log, stderr=log, env={**os.environ, "PYTHONPATH": str(REPO)}
        )

    def stop_started(self, name: str, timeout: float = 30) -> int:
        """`stop`, once member `name` is running (its signal handlers are set then): a member
        still starting up when SIGTERM comes dies of the signal (exit -15), which the final
        stops of a run, asserting a clean exit, would take for a failure of the member. A
        survivor spawned at the wind-down can be asked to stop 0.6 s after its start."""
        p = self.procs[name]
        log = self.workdir / f"{name}.log"
        deadline = time.monotonic() + timeout
        while p.poll() is None and "consumer_started" not in log.read_text(errors="replace"):
            if time.monotonic() > deadline:
                raise AssertionError(f"member {name} did not start within {timeout}s")
            time.sleep(0.1)
        return self.stop(name, timeout)

    def stop(self, name: str, timeout: float = 30) -> int:
        p = self.procs.pop(name)
        p.send_signal(signal.SIGTERM)
        try:
            return p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGUSR1)  # every thread's stack into its log
            time.sleep(1.0)
            p.kill()
            p.wait(10)
            tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-6000:]
            raise AssertionError(
                f"member {name} did not stop within {timeout}s of SIGTERM:\n{tail}"
            ) from None

    def kill(self, name: str) -> None:
        p = self.procs.pop(name)
        p.kill()
        p.wait(10)

    def freeze(self, name: str, seconds: float) -> None:
        p = self.procs[name]
        p.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        p.send_signal(signal.SIGCONT)

    def wait_for(
        self, pred: Callable[[list[dict[str, Any]]], object], timeout: float, what: str
    ) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    tail = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise AssertionError(f"member {name} exited with {p.returncode}:\n{tail}")
            evs = self.events()
            if pred(evs):
                return evs
            time.sleep(0.2)
        raise AssertionError(f"timed out waiting for {what}")

    def finish(
        self, producer: SteadyProducer, bootstrap: str, topic: str, partitions: int, timeout: float
    ) -> list[int]:
        """Stop producing, wait until every produced record was handled and the group's commits
        reached the end offsets, then stop every member gracefully. Returns the end offsets.

        Handled is not committed: a member whose commits failed because its generation ended
        (ILLEGAL_GENERATION in a rebalance) leaves its last records to their next owner, which
        handles them again. Stopping every member as soon as all records were handled once could
        stop that owner first, leaving a committed offset below the end with nothing lost."""
        producer.finish()
        ends = end_offsets(bootstrap, topic, partitions)
        self.wait_for(
            lambda e: check(e, ends).distinct >= sum(ends),
            timeout,
            "every produced record to be handled",
        )
        self.wait_for(
            lambda e: committed(bootstrap, self.group, topic, partitions) == ends,
            timeout,
            "the group's commits to reach the end offsets",
        )
        for name in list(self.procs):
            assert self.stop_started(name) == 0
        return ends

    def reap(self, dying: set[str]) -> list[str]:
        """Members of `dying` (each told to kill itself at some point) that have: forgotten,
        named."""
        gone = [n for n in dying & set(self.procs) if self.procs[n].poll() is not None]
        for name in gone:
            self.procs.pop(name)
        return gone

    def wind_down(
        self,
        producer: SteadyProducer,
        dying: set[str],
        spawn_survivor: Callable[[], None],
        committed_now: Callable[[], list[int] | None],
        bootstrap: str,
        topic: str,
        partitions: int,
    ) -> list[int]:
        """The end of a chaos run: stop producing, stop the members still due to die, start one
        that will not (`spawn_survivor`), wait until the group's commits (`committed_now`, None
        while they cannot be read) reach the end offsets, then stop every member gracefully.
        Returns the end offsets."""
        producer.finish()
        for name in sorted(dying & set(self.procs)):
            if self.procs[name].poll() is None:
                self.stop(name)
        self.reap(dying)
        spawn_survivor()
        ends = end_offsets(bootstrap, topic, partitions)
        self.wait_for(
            lambda _: committed_now() == ends, 120, "the group's commits to reach the end offsets"
        )
        for name in list(self.procs):
            assert self.stop_started(name) == 0
        return ends

    def close(self) -> None:
        for p in self.procs.values():
            p.send_signal(signal.SIGCONT)
            p.kill()
            p.wait(10)
        self.procs.clear()


def handled_by(evs: list[dict[str, Any]], member: str) -> int:
    return sum(1 for e in evs if e["ev"] == "done" and e["m"] == member)


class SteadyProducer(threading.Thread):
    """Produces keyed records at a steady rate until stopped; counts what was acknowledged."""

    def __init__(self, bootstrap: str, topic: str, rate: float) -> None:
        super().__init__(daemon=True)
        self._p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
        self._topic = topic
        self._rate = rate
        self._halt = threading.Event()
        self.sent = 0

    def run(self) -> None:
        start = time.monotonic()
        while not self._halt.is_set():
            due = int((time.monotonic() - start) * self._rate)
            while self.sent < due:
                self._p.produce(self._topic, key=b"k%d" % (self.sent % 97), value=b"x" * 64)
                self.sent += 1
            self._p.poll(0)
            time.sleep(0.01)

    def finish(self) -> None:
        self._halt.set()
        self.join(10)
        assert self._p.flush(30) == 0
