"""One audited GroupConsumer member, run as its own process by rebalance and chaos tests."""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any, Literal

from confluent_kafka import Producer
from typing_extensions import TypedDict

from tests.audit import AuditedHandler, AuditWriter
from tests.audit.exactly_once import AuditedBatchTransform, AuditedTransform
from tests.consumer_overrides import GroupProtocol, Overrides
from weir import CommitEvent, FlowConfig, GroupConsumer, Handler
from weir.config import ConsumerSettings


class ProtocolSettings(TypedDict, total=False):
    """The settings that pick a member's group protocol and assignor, and its timeouts."""

    group_protocol: GroupProtocol
    assignment_strategy: Literal["range", "roundrobin", "cooperative-sticky"]
    session_timeout_s: float
    heartbeat_interval_s: float


PROTOCOLS: dict[str, ProtocolSettings] = {
    "eager": {"group_protocol": "classic", "assignment_strategy": "range"},
    "roundrobin": {"group_protocol": "classic", "assignment_strategy": "roundrobin"},
    "cooperative": {"group_protocol": "classic", "assignment_strategy": "cooperative-sticky"},
    "consumer": {"group_protocol": "consumer"},
    "auto": {"group_protocol": "auto"},
}
CLASSIC_TIMEOUTS: ProtocolSettings = {"session_timeout_s": 6.0, "heartbeat_interval_s": 1.0}


def settings(protocol: str) -> ProtocolSettings:
    s = PROTOCOLS[protocol].copy()
    if s["group_protocol"] == "classic":
        s.update(CLASSIC_TIMEOUTS)
    return s


class DyingProducer(Producer):
    """A transactional producer whose process SIGKILLs itself in its `die_at`-th commit, after
    the transaction's outputs and offsets were sent and before it commits: the transaction
    stays open (its offsets pending, UNSTABLE_OFFSET_COMMIT for the next owner) until the
    broker aborts it at transaction_timeout_s."""

    def __init__(self, conf: dict[str, Any], die_at: int, audit: AuditWriter) -> None:
        super().__init__(conf)
        self._die_at = die_at
        self._audit = audit
        self._commits = 0

    def commit_transaction(self, *args: Any, **kwargs: Any) -> None:
        self._commits += 1
        if self._commits == self._die_at:
            self._audit.write("killed_in_commit")
            os.kill(os.getpid(), signal.SIGKILL)
        super().commit_transaction(*args, **kwargs)


class DyingOutputs(Producer):
    """An at-least-once member's output producer whose process SIGKILLs itself right after its
    `die_at`-th output was handed to librdkafka, before its delivery report could come back:
    the outputs in flight are lost or written, and their records must not have been committed."""

    def __init__(self, conf: dict[str, Any], die_at: int, audit: AuditWriter) -> None:
        super().__init__(conf)
        self._die_at = die_at
        self._audit = audit
        self._produced = 0

    def produce(self, *args: Any, **kwargs: Any) -> None:
        super().produce(*args, **kwargs)
        self._produced += 1
        if self._produced == self._die_at:
            self._audit.write("killed_after_produce")
            os.kill(os.getpid(), signal.SIGKILL)


def _held(text: str) -> tuple[int, int]:
    partition, _, offset = text.partition(":")
    return int(partition), int(offset)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bootstrap", required=True)
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--protocol", choices=sorted(PROTOCOLS), required=True)
    ap.add_argument("--member", required=True)
    ap.add_argument("--audit", type=Path, required=True)
    ap.add_argument("--slow-ms", type=float, default=5.0)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--max-poll-ms", type=int, default=20_000)
    ap.add_argument("--instance-id", default=None)
    # Classic protocol: replace CLASSIC_TIMEOUTS (6 s session, 1 s heartbeat); 0 leaves the
    # setting to librdkafka (45 s session, 3 s heartbeat: what a user gets by default).
    ap.add_argument("--session-timeout", type=float, default=None)
    ap.add_argument("--heartbeat", type=float, default=None)
    ap.add_argument("--no-offset-map", action="store_true", help="offset_map=False")
    ap.add_argument("--offset-map-max-bytes", type=int, default=None)
    ap.add_argument(
        "--hold", type=_held, action="append", default=[], help="PARTITION:OFFSET, repeatable"
    )
    ap.add_argument("--commit-interval", type=float, default=0.25)
    ap.add_argument("--commit-every-records", type=int, default=None)
    ap.add_argument("--shutdown-timeout", type=float, default=8.0)
    ap.add_argument("--capacity-records", type=int, default=None)
    ap.add_argument("--stall-every", type=int, default=0, help="every Nth offset is slow")
    ap.add_argument("--stall-ms", type=float, default=0.0)
    # Exactly-once: produce the transform of every record to this topic, transactionally.
    ap.add_argument("--output", default=None)
    ap.add_argument("--ordering", choices=["key", "partition", "unordered"], default="key")
    ap.add_argument("--transaction-interval", type=float, default=0.1)
    ap.add_argument("--transaction-timeout", type=float, default=10.0)
    ap.add_argument("--die-at-commit", type=int, default=0)
    # At-least-once outputs: produce the transform of every record to this topic (ctx.produce
    # without transactional_id), the process killed after its Nth output (--die-at-produce).
    ap.add_argument("--alo-output", default=None)
    ap.add_argument("--die-at-produce", type=int, default=0)
    # With --output: a batch handler (handle_batch) of batches of at most this many records.
    ap.add_argument("--batch", type=int, default=0)
    args = ap.parse_args(argv)
    # `Members.stop` asks for every thread's stack (in the member's log) when a stop hangs.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    audit = AuditWriter(args.audit, args.member)
    extra: Overrides = {}
    if args.commit_every_records is not None:
        extra["commit_every_records"] = args.commit_every_records
    if args.offset_map_max_bytes is not None:
        extra["offset_map_max_bytes"] = args.offset_map_max_bytes
    if args.capacity_records is not None:
        cap = args.capacity_records
        extra["flow"] = FlowConfig(
            capacity_records=cap, pause_records=cap * 9 // 10, resume_records=cap * 8 // 10
        )
    protocol = settings(args.protocol)
    if protocol["group_protocol"] == "classic":
        if args.session_timeout == 0:
            protocol.pop("session_timeout_s", None)
        elif args.session_timeout is not None:
            protocol["session_timeout_s"] = args.session_timeout
        if args.heartbeat == 0:
            protocol.pop("heartbeat_interval_s", None)
        elif args.heartbeat is not None:
            protocol["heartbeat_interval_s"] = args.heartbeat
    if args.output is not None:
        extra["transactional_id"] = f"{args.group}-{args.member}"
        extra["transaction_interval_s"] = args.transaction_interval
        extra["transaction_timeout_s"] = args.transaction_timeout
    config: ConsumerSettings = {
        "bootstrap_servers": args.bootstrap,
        "group_id": args.group,
        "topics": [args.topic],
        "workers": args.workers,
        "ordering": args.ordering,
        "offset_map": not args.no_offset_map,
        "commit_interval_s": args.commit_interval,
        "revoke_timeout_s": 5.0,
        "shutdown_timeout_s": args.shutdown_timeout,
        "max_poll_interval_s": args.max_poll_ms / 1000,
        "group_instance_id": args.instance_id,
        **protocol,
        **extra,
    }
    handler: Handler = AuditedHandler(
        audit, args.slow_ms, frozenset(args.hold), args.stall_every, args.stall_ms
    )
    if args.output is not None:
        handler = AuditedTransform(audit, args.output, args.slow_ms)
        if args.batch:
            handler = AuditedBatchTransform(audit, args.output, args.slow_ms)
            config["batch_max_records"] = args.batch
    die_at: int = args.die_at_commit
    factory: Any = (lambda conf: DyingProducer(conf, die_at, audit)) if die_at else None
    if args.alo_output is not None:
        handler = AuditedTransform(audit, args.alo_output, args.slow_ms)
        die_after: int = args.die_at_produce
        if die_after:
            factory = lambda conf: DyingOutputs(conf, die_after, audit)  # noqa: E731
    gc = GroupConsumer(handler, producer_factory=factory, **config)

    def on_commit(e: CommitEvent) -> None:
        audit.commit(e)
        if e.ok:
            audit.stats(gc.stats())

    gc.add_commit_listener(on_commit)
    audit.write("member_start")
    try:
        gc.run()
    finally:
        audit.stats(gc.stats())
        audit.write("member_stop")
        audit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
