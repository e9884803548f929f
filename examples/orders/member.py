"""One member of the orders demo: a `GroupConsumer` in a process of its own.

The demo starts it as ``python -m examples.orders.member`` through `Members` (at the end of this
module). SIGTERM or SIGINT make `GroupConsumer.run` drain the in-flight orders, commit synchronously
and leave the group.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from examples.orders import Journal, JournalReader, Ledger
from weir import Context, GroupConsumer, Handler, Partition, Record
from weir.prometheus import serve

ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1


class OrderHandler(Handler):
    """Pretends to charge each order (a random 'payment API' latency), then journals it."""

    def __init__(self, journal: Journal, min_ms: float, max_ms: float) -> None:
        self._journal = journal
        self._min = min_ms / 1000
        self._max = max_ms / 1000

    def handle(self, record: Record, ctx: Context) -> None:
        order = json.loads(record.value or b"{}")
        time.sleep(random.uniform(self._min, self._max))
        self._journal.write(
            "rec",
            p=record.partition,
            o=record.offset,
            k=order["customer"],
            s=order["seq"],
            t=ctx.token,
        )

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self._ownership("assigned", partitions)

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self._ownership("revoked", partitions)

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self._ownership("lost", partitions)

    def on_shutdown(self) -> None:
        self._journal.write("shutdown", ts=time.time())

    def _ownership(self, event: str, partitions: Sequence[Partition]) -> None:
        self._journal.write(event, p=sorted(tp.partition for tp in partitions), ts=time.time())


def die_with_parent() -> None:
    """Have Linux kill this process if the demo dies without cleaning up (SIGKILL, a crash).

    Set here rather than in a preexec_fn: the parent forks from a process with running threads.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    # The parent may have gone before prctl ran; nobody would ever signal us then.
    if os.getppid() != parent:
        sys.exit(1)


def configure_logging(level: str) -> None:
    # weir logs every partition move at info and every commit at debug, through the stdlib
    # loggers `weir.*` (librdkafka's own lines through `weir.librdkafka`); stderr is a file the
    # parent keeps, so info is plenty and the terminal never sees it. ProcessorFormatter renders
    # weir's structlog events with all their fields, and the other records alike.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.add_log_level,
                structlog.stdlib.add_logger_name,
                structlog.processors.TimeStamper(fmt="%H:%M:%S.%f"),
                structlog.processors.format_exc_info,
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(colors=False),
            ]
        )
    )
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(level.upper())


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m examples.orders.member",
        description="One member of the orders demo (started by python -m examples.orders).",
    )
    ap.add_argument("--id", required=True, help="member name, also the Kafka client.id")
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--journal", type=Path, required=True)
    ap.add_argument("--protocol", choices=["classic", "consumer"], default="classic")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--min-ms", type=float, default=1.0)
    ap.add_argument("--max-ms", type=float, default=20.0)
    ap.add_argument("--commit-interval", type=float, default=0.5)
    ap.add_argument("--log-level", default="info")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    die_with_parent()
    configure_logging(args.log_level)
    journal = Journal(args.journal)
    # Classic members learn of a rebalance only from a heartbeat (default every 3 s), and a
    # cooperative rebalance takes two rounds: beat faster so joins and leaves settle in ~1 s.
    # Under KIP-848 the broker sets the heartbeat, and the client refuses the setting.
    consumer = GroupConsumer(
        OrderHandler(journal, args.min_ms, args.max_ms),
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        ordering="key",
        workers=args.workers,
        group_protocol=args.protocol,
        commit_interval_s=args.commit_interval,
        shutdown_timeout_s=15.0,
        kafka={"client.id": args.id},
        heartbeat_interval_s=0.5 if args.protocol == "classic" else None,
    )
    # What an operator would scrape: the parent reads each member's /metrics and /readyz.
    server = serve(consumer, port=0, host="127.0.0.1", member=args.id)
    journal.write("metrics", url=server.url)
    try:
        consumer.run()
    except Exception as exc:
        journal.write("failed", error=repr(exc))
        logging.getLogger("examples.orders.member").exception("member_failed")
        return 1
    finally:
        server.close()
        journal.close()
    return 0


# -- the parent's side: start, follow and stop member processes -----------------------------


@dataclass
class Member:
    name: str
    proc: subprocess.Popen[bytes]
    journal: JournalReader
    log_path: Path
    stopping: bool = False
    exited: bool = False

    @property
    def state(self) -> str:
        rc = self.proc.poll()
        if rc is None:
            return "stopping" if self.stopping else "running"
        return "left" if rc == 0 else f"exited ({rc})"


class Members:
    """The member processes: started, stopped and followed through their journals."""

    def __init__(self, workdir: Path, member_args: list[str]) -> None:
        self.workdir = workdir
        self.member_args = member_args
        self.all: dict[str, Member] = {}

    def start(self, name: str) -> Member:
        journal = self.workdir / f"{name}.jsonl"
        log_path = self.workdir / f"{name}.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.getenv("PYTHONPATH", "")]),
        }
        with log_path.open("wb") as out:
            proc = subprocess.Popen(
                [
                    *(sys.executable, "-m", "examples.orders.member"),
                    *("--id", name, "--journal", str(journal), *self.member_args),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                # Own session: Ctrl-C reaches only the parent, which then stops members in order.
                start_new_session=True,
            )
        member = Member(name, proc, JournalReader(journal), log_path)
        self.all[name] = member
        return member

    def terminate(self, name: str) -> None:
        member = self.all[name]
        if member.proc.poll() is None:
            member.stopping = True
            member.proc.send_signal(signal.SIGTERM)

    def running(self) -> list[Member]:
        return [m for m in self.all.values() if m.proc.poll() is None]

    def poll(self, ledger: Ledger) -> list[Member]:
        """Feed new journal lines to the ledger; return members that exited since the last call."""
        exited = []
        for m in self.all.values():
            done = m.proc.poll() is not None  # before reading, so no line written after is missed
            for event in m.journal.read_new():
                ledger.apply(m.name, event)
            if done and not m.exited:
                m.exited = True
                ledger.release(m.name)
                exited.append(m)
        return exited

    def kill_all(self, timeout: float = 30.0) -> None:
        """Last-resort cleanup: SIGTERM, wait, then SIGKILL whatever is left."""
        for m in self.running():
            self.terminate(m.name)
        deadline = time.monotonic() + timeout
        try:
            for m in self.all.values():
                with contextlib.suppress(subprocess.TimeoutExpired):
                    m.proc.wait(max(0.0, deadline - time.monotonic()))
        finally:
            for m in self.running():
                m.proc.kill()
                m.proc.wait()


if __name__ == "__main__":
    sys.exit(main())
