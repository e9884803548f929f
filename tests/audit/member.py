"""One audited GroupConsumer member, run as its own process by rebalance and chaos tests."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import structlog

from tests.audit import AuditedHandler, AuditWriter
from weir import GroupConsumer

PROTOCOLS = {
    "eager": {"group_protocol": "classic", "assignment_strategy": "range"},
    "roundrobin": {"group_protocol": "classic", "assignment_strategy": "roundrobin"},
    "cooperative": {"group_protocol": "classic", "assignment_strategy": "cooperative-sticky"},
    "consumer": {"group_protocol": "consumer"},
}
CLASSIC_TIMEOUTS = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def settings(protocol: str) -> dict[str, object]:
    s: dict[str, object] = dict(PROTOCOLS[protocol])
    if s["group_protocol"] == "classic":
        s.update(CLASSIC_TIMEOUTS)
    return s


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
    args = ap.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
    audit = AuditWriter(args.audit, args.member)
    gc = GroupConsumer(
        AuditedHandler(audit, args.slow_ms),
        bootstrap_servers=args.bootstrap,
        group_id=args.group,
        topics=[args.topic],
        workers=args.workers,
        commit_interval=0.25,
        revoke_timeout=5.0,
        shutdown_timeout=8.0,
        max_poll_interval_ms=args.max_poll_ms,
        group_instance_id=args.instance_id,
        **settings(args.protocol),  # type: ignore[arg-type]
    )
    gc.add_commit_listener(audit.commit)
    audit.write("member_start")
    try:
        gc.run()
    finally:
        audit.write("member_stop")
        audit.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
