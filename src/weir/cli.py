"""The `weir` command line.

Each top-level command is a registrar in ``SUBCOMMANDS`` that adds its own sub-parser and sets
``handler``; adding a command means adding one function and one dict entry.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias, cast

import structlog

if TYPE_CHECKING:
    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    from weir.testing.broker import EmbeddedKafka

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["SubParsers"], None]

STOP_TIMEOUT_S = 30.0


# --- weir broker ... ---------------------------------------------------------------------------


def _register_broker(commands: SubParsers) -> None:
    broker = commands.add_parser("broker", help="run a local Kafka broker for development")
    actions = broker.add_subparsers(dest="action", required=True, metavar="ACTION")

    state_help = "state file (default: <cache dir>/broker.json)"
    start = actions.add_parser("start", help="start an embedded single-node Kafka")
    start.add_argument(
        "--foreground", action="store_true", help="run until Ctrl-C instead of in the background"
    )
    start.add_argument("--dir", type=Path, help="work directory (default: a new temp dir)")
    start.add_argument("--state", type=Path, help=state_help)
    start.add_argument("--port", type=int, help="client port (default: a free one)")
    start.add_argument(
        "--override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="broker setting, repeatable",
    )
    start.add_argument("--timeout", type=float, default=90.0, help="start-up timeout in seconds")
    start.set_defaults(handler=_broker_start)

    stop = actions.add_parser("stop", help="stop the broker started by `weir broker start`")
    stop.add_argument("--state", type=Path, help=state_help)
    stop.add_argument("--timeout", type=float, default=STOP_TIMEOUT_S)
    stop.set_defaults(handler=_broker_stop)

    status = actions.add_parser("status", help="print the broker's address and whether it answers")
    status.add_argument("--state", type=Path, help=state_help)
    status.set_defaults(handler=_broker_status)


def _state_path(args: argparse.Namespace) -> Path:
    if args.state is not None:
        return Path(args.state)
    from weir.testing.jars import cache_root

    return cache_root() / "broker.json"


def _read_state(path: Path) -> dict[str, Any] | None:
    try:
        state: dict[str, Any] = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return state


def _broker_start(args: argparse.Namespace) -> int:
    from weir.testing.broker import EmbeddedKafka

    state_path = _state_path(args)
    state = _read_state(state_path)
    if state is not None:
        if _is_kafka_process(int(state["pid"])):
            print(f"already running: {state['bootstrap_servers']} (pid {state['pid']})")
            return 0
        if state.get("remove_workdir"):  # left by a broker that died without `weir broker stop`
            shutil.rmtree(state["workdir"], ignore_errors=True)
    overrides = dict(_parse_override(item) for item in args.override)
    kafka = EmbeddedKafka(
        overrides=overrides,
        workdir=args.dir,
        # Background: the broker must outlive this process and keep its files until `stop`.
        keep=True if not args.foreground else None,
        port=args.port,
        start_timeout=args.timeout,
        die_with_parent=args.foreground,
    )
    kafka.start()
    state_path.parent.mkdir(parents=True, exist_ok=True)
    state_path.write_text(
        json.dumps(
            {
                "pid": kafka.pid,
                "bootstrap_servers": kafka.bootstrap_servers,
                "workdir": str(kafka.workdir),
                "log_path": str(kafka.log_path),
                "remove_workdir": args.dir is None,
                "started_at": time.time(),
            },
            indent=2,
        )
    )
    print(kafka.bootstrap_servers)
    print(f"log: {kafka.log_path}", file=sys.stderr)
    if not args.foreground:
        return 0
    try:
        return _run_in_foreground(kafka)
    finally:
        kafka.stop()
        state_path.unlink(missing_ok=True)


def _run_in_foreground(kafka: EmbeddedKafka) -> int:
    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_sigterm)
    print("running; Ctrl-C to stop", file=sys.stderr)
    try:
        while kafka.running:
            time.sleep(0.5)
    except KeyboardInterrupt:
        print("stopping", file=sys.stderr)
        return 0
    print(f"broker exited unexpectedly; see {kafka.log_path}", file=sys.stderr)
    return 1


def _broker_stop(args: argparse.Namespace) -> int:
    state_path = _state_path(args)
    state = _read_state(state_path)
    if state is None:
        print("no broker running")
        return 0
    pid = int(state["pid"])
    if _is_kafka_process(pid):
        _terminate(pid, args.timeout)
    if state.get("remove_workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)
    state_path.unlink(missing_ok=True)
    print(f"stopped {state['bootstrap_servers']}")
    return 0


def _broker_status(args: argparse.Namespace) -> int:
    from weir.testing.broker import port_accepts

    state = _read_state(_state_path(args))
    if state is None:
        print("no broker running")
        return 1
    bootstrap = str(state["bootstrap_servers"])
    alive = _is_kafka_process(int(state["pid"]))
    reachable = port_accepts(int(bootstrap.rsplit(":", 1)[1]))
    print(bootstrap)
    print(
        f"pid {state['pid']}: {'running' if alive else 'not running'}; "
        f"{'reachable' if reachable else 'not reachable'}; log: {state.get('log_path')}"
    )
    return 0 if alive and reachable else 1


def _parse_override(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"--override expects KEY=VALUE, got {item!r}")
    return key.strip(), value.strip()


def _is_kafka_process(pid: int) -> bool:
    """Whether ``pid`` is still our broker, not a dead one or a recycled pid."""
    proc = Path(f"/proc/{pid}")
    if proc.is_dir():
        try:
            # A zombie (state Z) has exited; only its parent has not reaped it yet.
            if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                return False
            return b"kafka.Kafka" in (proc / "cmdline").read_bytes()
        except OSError:
            return False
    if Path("/proc/self").is_dir():
        return False  # Linux and no /proc entry: gone
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def _terminate(pid: int, timeout: float) -> None:
    # The broker is not our child (a previous `weir broker start` spawned it), so poll, not wait().
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _is_kafka_process(pid):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


# --- entry point ---------------------------------------------------------------------------------

SUBCOMMANDS: dict[str, Registrar] = {
    "broker": _register_broker,
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="weir", description="kafka-weir: consume Kafka with worker threads, losing nothing."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for register in SUBCOMMANDS.values():
        register(commands)
    return parser


class _CurrentStderr:
    """Whatever sys.stderr is at write time (main() may run inside pytest's capture)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _configure_logging() -> None:
    # stdout carries results (e.g. the bootstrap address for scripts); logs go to stderr.
    if not structlog.is_configured():
        structlog.configure(
            logger_factory=structlog.PrintLoggerFactory(cast(TextIO, _CurrentStderr())),
            wrapper_class=structlog.make_filtering_bound_logger(logging.INFO),
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    _configure_logging()
    handler: Handler = args.handler
    from weir.testing.errors import HarnessError

    try:
        return handler(args)
    except HarnessError as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return 1
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))


if __name__ == "__main__":
    sys.exit(main())
