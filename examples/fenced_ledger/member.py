"""One member of the fenced ledger demo: a `GroupConsumer` in a process of its own.

Started by ``python -m examples.fenced_ledger`` (the end of this module is the parent's side).
It journals what its handler does (``applied``, ``replay``, ``fenced``) and its partitions to a
JSON-lines file that the demo reads. ``--stall-after N`` makes it stop at its (N+1)-th transfer
and wait for ``--resume-file``, as a long GC pause would: the demo freezes it there (SIGSTOP).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from examples.fenced_ledger import LedgerHandler
from weir import Context, GroupConsumer, Handler, Partition, Record
from weir.errors import FencedError
from weir.fencing import Fence, FencePruner, SqliteFence

ROOT = Path(__file__).resolve().parents[2]
_PR_SET_PDEATHSIG = 1


class Journal:
    def __init__(self, path: Path, member: str) -> None:
        self._f = path.open("a", buffering=1, encoding="utf-8")
        self._member = member
        self._lock = threading.Lock()

    def write(self, ev: str, **fields: Any) -> None:
        line = json.dumps({"ev": ev, "m": self._member, "t": time.time(), **fields})
        with self._lock:
            self._f.write(line + "\n")

    def close(self) -> None:
        self._f.close()


class JournalsPartitions:
    """A handler's partition hooks, journaled (what the demo reads a member's partitions from)."""

    journal: Journal

    def on_assigned(self, partitions: Sequence[Partition]) -> None:
        self.journal.write("assigned", ps=[tp.partition for tp in partitions])

    def on_revoked(self, partitions: Sequence[Partition]) -> None:
        self.journal.write("revoked", ps=[tp.partition for tp in partitions])

    def on_lost(self, partitions: Sequence[Partition]) -> None:
        self.journal.write("lost", ps=[tp.partition for tp in partitions])


class JournaledLedger(JournalsPartitions, LedgerHandler):
    """The ledger handler, journaling each outcome; optionally stalls once (the zombie)."""

    def __init__(
        self,
        fence: Fence[Any],
        args: argparse.Namespace,
        journal: Journal,
    ) -> None:
        super().__init__(fence, args.group, args.id, postgres=args.postgres is not None)
        self.journal = journal
        self.stall_after: int | None = args.stall_after
        # PostgreSQL: stall inside the fenced transaction, after the debit and credit. SQLite:
        # just before it; a process frozen inside a SQLite write transaction would keep the
        # database's one write lock, and nobody could write until it ran again.
        self.stall_inside = args.postgres is not None
        self.resume_file: Path | None = args.resume_file
        self._seen = 0
        self._lock = threading.Lock()
        self._stalled = False
        self._local = threading.local()  # this worker's record stalls inside its write

    def handle(self, record: Record, ctx: Context) -> None:
        stall = self._stall_due()
        if stall and not self.stall_inside:
            self._stall(record)
        self._local.stall = stall and self.stall_inside
        where = {"p": record.partition, "o": record.offset, "epoch": ctx.epoch}
        try:
            applied = self.apply(record, ctx)
        except FencedError as exc:
            self.journal.write("fenced", **where, stored=exc.stored)
            raise
        self.journal.write("applied" if applied else "replay", **where)

    def write(self, conn: Any, record: Record) -> None:
        super().write(conn, record)
        if getattr(self._local, "stall", False):
            self._local.stall = False
            self._stall(record)

    def _stall_due(self) -> bool:
        with self._lock:
            self._seen += 1
            if self.stall_after is None or self._stalled or self._seen <= self.stall_after:
                return False
            self._stalled = True
            return True

    def _stall(self, record: Record) -> None:
        self.journal.write("stalled", p=record.partition, o=record.offset)
        assert self.resume_file is not None
        while not self.resume_file.exists():
            time.sleep(0.01)


def member_parser(module: str) -> argparse.ArgumentParser:
    """The arguments every member of a demo takes (`run_member` reads them)."""
    ap = argparse.ArgumentParser(prog=f"python -m {module}")
    ap.add_argument("--id", required=True)
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--journal", type=Path, required=True)
    ap.add_argument("--commit-interval", type=float, default=0.5)
    return ap


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = member_parser("examples.fenced_ledger.member")
    ap.add_argument("--sqlite", type=Path, help="the ledger's SQLite file")
    ap.add_argument("--postgres", help="the ledger's PostgreSQL connection string")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--stall-after", type=int, default=None)
    ap.add_argument("--resume-file", type=Path, default=None)
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    become_member()
    journal = Journal(args.journal, args.id)
    fence: Fence[Any]
    if args.postgres is not None:
        from weir.fencing import PostgresFence

        fence = PostgresFence(args.postgres)
    else:
        fence = SqliteFence(args.sqlite)
    handler = JournaledLedger(fence, args, journal)
    return run_member(args, journal, handler, fence, {"workers": args.workers})


def become_member() -> None:
    """A member process: it dies with the demo (even a SIGKILLed one) and logs at INFO."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


def run_member(
    args: argparse.Namespace,
    journal: Journal,
    handler: Handler,
    fence: Fence[Any],
    settings: dict[str, Any],
) -> int:
    """Run a member of the demo's group with `handler` and `fence` (and `settings`) until it is
    stopped; its start and a failure go to the journal. Its exit code."""
    consumer = GroupConsumer(
        handler,
        fence=fence,  # epochs acquired on assignment, before the first record: ctx.epoch
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        commit_interval_s=args.commit_interval,
        auto_offset_reset="earliest",
        assignment_strategy="cooperative-sticky",
        # A frozen or killed member is out of the group after 3 s (the demo waits for that).
        session_timeout_s=3.0,
        heartbeat_interval_s=0.5,
        kafka={"client.id": args.id},
        **settings,
    )
    consumer.add_commit_listener(FencePruner(fence, args.group, interval_s=1.0))
    journal.write("started", pid=os.getpid())
    try:
        consumer.run()
    except Exception as exc:
        journal.write("failed", error=repr(exc))
        logging.getLogger(type(handler).__module__).exception("member_failed")
        return 1
    finally:
        journal.close()
    return 0


# -- the parent's side ------------------------------------------------------------------------


class Members:
    """The member processes of one demo run (`module` run with ``-m``), their journals and
    logs in `workdir`."""

    def __init__(
        self, workdir: Path, common: list[str], module: str = "examples.fenced_ledger.member"
    ) -> None:
        self.workdir = workdir
        self.common = common
        self.module = module
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, *extra: str) -> None:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.getenv("PYTHONPATH", "")]),
        }
        with (self.workdir / f"{name}.log").open("wb") as out:
            self.procs[name] = subprocess.Popen(
                [
                    *(sys.executable, "-m", self.module, "--id", name),
                    *("--journal", str(self.workdir / f"{name}.jsonl"), *self.common, *extra),
                ],
                cwd=ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def events(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in self.workdir.glob("*.jsonl"):
            for line in path.read_text(encoding="utf-8").splitlines():
                with contextlib.suppress(json.JSONDecodeError):  # a killed member's torn line
                    out.append(json.loads(line))
        return sorted(out, key=lambda e: e["t"])

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        proc.send_signal(sig)
        if sig == signal.SIGSTOP:
            # The kernel stops the process when it next runs, not at once: on a busy machine
            # it may go on for tens of milliseconds, past whatever is done next on the
            # assumption that it is frozen (the resume file). Wait until it is.
            wait_stopped(proc.pid)

    def exited(self) -> dict[str, int]:
        return {n: p.returncode for n, p in self.procs.items() if p.poll() is not None}

    def stop_all(self, timeout: float = 30.0) -> dict[str, int]:
        """SIGCONT and SIGTERM to every running member; their exit codes."""
        for p in self.procs.values():
            if p.poll() is None:
                p.send_signal(signal.SIGCONT)
                p.send_signal(signal.SIGTERM)
        codes = {}
        deadline = time.monotonic() + timeout
        for name, p in self.procs.items():
            try:
                codes[name] = p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                codes[name] = p.wait()
        return codes


def wait_stopped(pid: int, timeout: float = 5.0) -> None:
    """Until every thread of the process is stopped (state T in /proc; where there is no
    /proc, a pause)."""
    tasks = Path(f"/proc/{pid}/task")
    if not tasks.exists():
        time.sleep(0.5)
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for stat in tasks.glob("*/stat"):
            try:
                # The state follows the command name, in parentheses and maybe with spaces.
                states.append(stat.read_text().rpartition(")")[2].split()[0])
            except (FileNotFoundError, ProcessLookupError):
                continue  # a thread that just ended
        if states and all(s in ("T", "t") for s in states):
            return
        time.sleep(0.001)
    raise TimeoutError(f"process {pid} did not stop within {timeout:g} s")


if __name__ == "__main__":
    sys.exit(main())
