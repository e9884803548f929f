"""The `weir` command line.

Each top-level command is a registrar in ``SUBCOMMANDS`` that adds its own sub-parser and sets
``handler``; adding a command means adding one function and one dict entry.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, TextIO, TypeAlias, cast

import structlog

from weir._cli import dlq, tail
from weir._cli.cluster import (
    add_cluster_arguments,
    admin_for,
    cluster_error_message,
    positive_seconds,
)
from weir._cli.console import number, table_console
from weir._cli.groups import register_groups
from weir._cli.offsets import register_offsets
from weir._cli.usage import UsageError, add_group_argument, resolve_group

if TYPE_CHECKING:
    SubParsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]
    from weir.testing.broker import EmbeddedKafka

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["SubParsers"], None]

STOP_TIMEOUT_S = 30.0
DEAD_LOG_LINES = 15


# --- weir broker ... ---------------------------------------------------------------------------


def _register_broker(commands: SubParsers) -> None:
    broker = commands.add_parser("broker", help="run a local Kafka broker for development")
    actions = broker.add_subparsers(dest="action", required=True, metavar="ACTION")

    state_help = "state file (default: <cache dir>/broker.json)"
    start = actions.add_parser("start", help="start an embedded single-node Kafka")
    start.add_argument(
        "--foreground", action="store_true", help="run until Ctrl-C instead of in the background"
    )
    start.add_argument(
        "--dir",
        type=Path,
        help="work directory, kept: starting again on it keeps topics, records, committed offsets "
        "and the port (default: a new temp dir, removed by `stop`)",
    )
    start.add_argument("--state", type=Path, help=state_help)
    start.add_argument("--port", type=_port, help="client port (default: a free one)")
    start.add_argument(
        "--override",
        action="append",
        default=[],
        type=_parse_override,
        metavar="KEY=VALUE",
        help="broker setting, repeatable",
    )
    start.add_argument(
        "--timeout", type=positive_seconds, default=90.0, help="start-up timeout in seconds"
    )
    secure = start.add_argument_group(
        "security",
        "a SASL_SSL listener for clients, as production runs Kafka: TLS with a CA made at "
        "start, SASL/SCRAM-SHA-512 and PLAIN users. The bootstrap servers printed are that "
        "listener's; each user's client settings (password included) are written to a file "
        "only you can read, whose path is printed. No password is ever printed. With --mtls, "
        "also an SSL listener where a client certificate is the login, and each user's "
        "settings for it.",
    )
    secure.add_argument("--secure", action="store_true", help="turn the secured listener on")
    secure.add_argument(
        "--user",
        action="append",
        default=[],
        metavar="NAME",
        help="a SASL user with a generated password, repeatable (default: weir)",
    )
    secure.add_argument(
        "--acls",
        action="store_true",
        help="KRaft's StandardAuthorizer: only super users may act until ACLs allow others",
    )
    secure.add_argument(
        "--super-user",
        action="append",
        default=[],
        metavar="NAME",
        help="a user allowed everything (implies --acls), repeatable",
    )
    secure.add_argument(
        "--mtls",
        action="store_true",
        help="clients must also present a certificate on the SASL_SSL listener; and an SSL "
        "listener opens where the certificate alone is the login (principal User:<its CN>)",
    )
    secure.add_argument(
        "--oauthbearer",
        action="store_true",
        help="also SASL/OAUTHBEARER with unsecured JWS tokens: any principal a token names "
        "logs in, held to the ACLs (a stand-in for an identity provider)",
    )
    start.set_defaults(handler=_broker_start)

    stop = actions.add_parser("stop", help="stop the broker started by `weir broker start`")
    stop.add_argument("--state", type=Path, help=state_help)
    stop.add_argument(
        "--timeout",
        type=positive_seconds,
        default=STOP_TIMEOUT_S,
        help="seconds to wait for a clean shutdown before SIGKILL",
    )
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
    """The state a background start left, or None when there is no file. Anything else that
    is not a state (unreadable, half written, edited) is an error: read as "no broker", it
    would have `start` launch a second broker and `stop` report success."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise UsageError(
            f"cannot read the broker state file {path}: {exc.strerror or exc}"
        ) from None
    try:
        state = json.loads(text)
    except ValueError as exc:
        problem: str | None = f"not JSON ({exc})"
    else:
        problem = _state_problem(state)
    if problem is not None:
        raise UsageError(
            f"the broker state file {path} is corrupt: {problem}. A broker started with it may "
            "still run (look for a kafka.Kafka process and stop it); then delete the file"
        )
    return cast(dict[str, Any], state)


def _state_problem(state: Any) -> str | None:
    if not isinstance(state, dict):
        return "not a JSON object"
    pid = state.get("pid")
    if type(pid) is not int or pid <= 0:
        return f"pid {pid!r} is not a process id"
    bootstrap = state.get("bootstrap_servers")
    if not isinstance(bootstrap, str) or not bootstrap.rpartition(":")[2].isdigit():
        return f"bootstrap_servers {bootstrap!r} is not HOST:PORT"
    for key in ("workdir", "log_path"):
        if key in state and not isinstance(state[key], str):
            return f"{key} {state[key]!r} is not a path"
    if state.get("remove_workdir") and "workdir" not in state:
        return "remove_workdir without a workdir"
    return None


def _check_state_writable(path: Path) -> None:
    """Before a broker starts: a state file that cannot be written would leave it running with
    nothing to find it by."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}."):
            pass
    except OSError as exc:
        raise UsageError(
            f"cannot write the broker state file {path}: {exc.strerror or exc}"
        ) from None


def _write_state(path: Path, state: dict[str, Any]) -> None:
    # Written aside, then renamed over: a reader never sees half a file.
    aside = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        aside.write_text(json.dumps(state, indent=2))
        os.replace(aside, path)
    finally:
        aside.unlink(missing_ok=True)


def _broker_security(args: argparse.Namespace) -> Any:
    """The `BrokerSecurity` the security options ask for, or None."""
    users = list(dict.fromkeys([*args.user, *args.super_user]))
    if not (args.secure or users or args.acls or args.mtls or args.oauthbearer):
        return None
    if not args.secure:
        raise UsageError("--user, --super-user, --acls, --mtls and --oauthbearer need --secure")
    from weir.testing.security import BrokerSecurity

    try:
        return BrokerSecurity(
            users=users or ["weir"],
            super_users=args.super_user,
            authorizer=args.acls or bool(args.super_user),
            mtls=args.mtls,
            ssl_listener=args.mtls,
            oauthbearer=args.oauthbearer,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _write_client_settings(
    kafka: EmbeddedKafka, mechanism: str = "SCRAM-SHA-512"
) -> dict[str, str]:
    """Each user's librdkafka settings as a properties file only its owner can read, by user:
    for the SASL_SSL listener, or with ``mechanism="SSL"`` for the SSL one (if it has one)."""
    from weir.testing.security import SSL, write_client_properties

    prepared = kafka.security
    if prepared is None or (mechanism == SSL and kafka.ssl_bootstrap_servers is None):
        return {}
    suffix = "-ssl" if mechanism == SSL else ""
    paths = {}
    for user in prepared.users:
        path = prepared.tls.directory / f"client-{user.name}{suffix}.properties"
        write_client_properties(kafka.client_settings(user.name, mechanism), path)
        paths[user.name] = str(path)
    return paths


def _broker_start(args: argparse.Namespace) -> int:
    from weir.testing.broker import EmbeddedKafka

    security = _broker_security(args)
    state_path = _state_path(args)
    state = _read_state(state_path)
    if state is not None:
        if _is_kafka_process(state["pid"]):
            _check_same_dir(state, args.dir, state_path)
            print(f"already running: {state['bootstrap_servers']} (pid {state['pid']})")
            return 0
        if state.get("remove_workdir"):  # left by a broker that died without `weir broker stop`
            shutil.rmtree(state["workdir"], ignore_errors=True)
    _check_state_writable(state_path)
    overrides = dict(args.override)
    # In the foreground, Ctrl-C and SIGTERM set an event from the start: one arriving right after
    # the address line (scripts wait for it) must stop the broker, not escape as a traceback.
    stop = threading.Event()
    restore = _stop_on_signals(stop) if args.foreground else None
    kafka = EmbeddedKafka(
        overrides=overrides,
        workdir=args.dir,
        # Background: the broker must outlive this process and keep its files until `stop`.
        keep=True if not args.foreground else None,
        port=args.port,
        start_timeout=args.timeout,
        die_with_parent=args.foreground,
        security=security,
    )
    try:
        kafka.start()
        client_settings = _write_client_settings(kafka)
        ssl_settings = _write_client_settings(kafka, "SSL")
    except BaseException:
        if restore is not None:
            restore()
        raise
    try:
        _write_state(
            state_path,
            {
                "pid": kafka.pid,
                "bootstrap_servers": kafka.bootstrap_servers,
                "workdir": str(kafka.workdir),
                "log_path": str(kafka.log_path),
                "remove_workdir": args.dir is None,
                "started_at": time.time(),
                "client_settings": client_settings,
                "ssl_bootstrap_servers": kafka.ssl_bootstrap_servers if kafka.security else None,
                "ssl_client_settings": ssl_settings,
            },
        )
    except BaseException as exc:
        kafka.stop()  # nothing would find it to stop it later
        if args.dir is None:
            shutil.rmtree(kafka.workdir, ignore_errors=True)
        if restore is not None:
            restore()
        if isinstance(exc, OSError):
            raise UsageError(
                f"cannot write the broker state file {state_path}: {exc.strerror or exc}; "
                "the broker is stopped"
            ) from None
        raise
    if not args.foreground:
        kafka.detach()  # its JVM holds the work directory's lock from now on
        _print_started(kafka, client_settings, ssl_settings)
        return 0
    try:
        _print_started(kafka, client_settings, ssl_settings)
        return _run_in_foreground(kafka, stop)
    finally:
        kafka.stop()
        state_path.unlink(missing_ok=True)
        assert restore is not None
        restore()


def _check_same_dir(state: dict[str, Any], wanted: Path | None, state_path: Path) -> None:
    if wanted is None:
        return
    running = Path(str(state.get("workdir", "")))
    if running != wanted.expanduser().resolve():
        raise UsageError(
            f"the broker of {state_path} runs on {running}, not {wanted}: stop it first "
            f"(weir broker stop --state {state_path}), or start with another --state"
        )


def _print_started(
    kafka: EmbeddedKafka, client_settings: dict[str, str], ssl_settings: dict[str, str]
) -> None:
    """The bootstrap servers on stdout (scripts read them); where to look next on stderr."""
    print(kafka.bootstrap_servers, flush=True)
    print(f"log: {kafka.log_path}", file=sys.stderr)
    if kafka.security is not None:
        print(f"CA certificate: {kafka.security.tls.ca_file}", file=sys.stderr)
    for user, path in client_settings.items():
        print(f"client settings of {user} (password inside): {path}", file=sys.stderr)
    if ssl_settings:
        print(
            f"SSL listener, a client certificate as the login: {kafka.ssl_bootstrap_servers}",
            file=sys.stderr,
        )
    for user, path in ssl_settings.items():
        print(
            f"client settings of {user} over SSL (certificate, no password): {path}",
            file=sys.stderr,
        )


def _stop_on_signals(stop: threading.Event) -> Callable[[], None]:
    """SIGINT and SIGTERM set `stop`; returns what restores the previous handlers."""

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    old = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}

    def restore() -> None:
        for s, h in old.items():
            signal.signal(s, h)

    return restore


def _run_in_foreground(kafka: EmbeddedKafka, stop: threading.Event) -> int:
    print("running; Ctrl-C to stop", file=sys.stderr)
    while kafka.running:
        if stop.wait(0.5):
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
    pid: int = state["pid"]
    if not _is_kafka_process(pid):
        # It died on its own (or was killed): say so, and keep its directory for the log.
        state_path.unlink(missing_ok=True)
        _report_dead_broker(state)
        return 1
    _terminate(pid, args.timeout)
    if state.get("remove_workdir"):
        shutil.rmtree(state["workdir"], ignore_errors=True)
    state_path.unlink(missing_ok=True)
    print(f"stopped {state['bootstrap_servers']}")
    return 0


def _report_dead_broker(state: dict[str, Any]) -> None:
    log_path = state.get("log_path") or str(Path(str(state.get("workdir", "."))) / "kafka.log")
    print(
        f"weir: the broker at {state['bootstrap_servers']} (pid {state['pid']}) was not running: "
        f"it died without `weir broker stop`. Its log: {log_path}",
        file=sys.stderr,
    )
    tail = _log_tail(Path(log_path), DEAD_LOG_LINES)
    if tail:
        print(f"--- last lines of {log_path} ---\n{tail}", file=sys.stderr)
    if state.get("remove_workdir"):
        print(
            f"its temp directory {state['workdir']} is kept for the log; remove it when done",
            file=sys.stderr,
        )


def _log_tail(path: Path, lines: int) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def _broker_status(args: argparse.Namespace) -> int:
    from weir.testing.broker import port_accepts

    state = _read_state(_state_path(args))
    if state is None:
        print("no broker running")
        return 1
    bootstrap = str(state["bootstrap_servers"])
    alive = _is_kafka_process(state["pid"])
    reachable = port_accepts(int(bootstrap.rsplit(":", 1)[1]))
    print(bootstrap)
    print(
        f"pid {state['pid']}: {'running' if alive else 'not running'}; "
        f"{'reachable' if reachable else 'not reachable'}; log: {state.get('log_path')}"
    )
    return 0 if alive and reachable else 1


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port from 1 to 65535, got {text!r}")
    return port


def _parse_override(item: str) -> tuple[str, str]:
    # An argparse type: its error is reported with the usage of the subcommand that was given.
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {item!r}")
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
    # Gone before `stop` says so: its port and its work directory's lock are free then.
    deadline = time.monotonic() + 10
    while _is_kafka_process(pid) and time.monotonic() < deadline:
        time.sleep(0.05)


# --- weir lag --------------------------------------------------------------------------------


def _register_lag(commands: SubParsers) -> None:
    lag = commands.add_parser(
        "lag",
        help="how far behind a consumer group is, per partition",
        description="Committed offset, log end offset and lag of every partition a consumer "
        "group consumes (any group, not only weir's), with the member that owns it.",
    )
    add_group_argument(lag)
    lag.add_argument(
        "--topic",
        "-t",
        action="append",
        metavar="TOPIC",
        help="only this topic, repeatable (default: every topic the group committed to or owns)",
    )
    lag.add_argument(
        "--watch",
        "-w",
        type=positive_seconds,
        metavar="SECONDS",
        help="redraw every SECONDS until Ctrl-C",
    )
    add_cluster_arguments(lag)
    lag.set_defaults(handler=_lag)


def _lag(args: argparse.Namespace) -> int:
    from weir.errors import WeirError
    from weir.lag import group_lag

    admin = admin_for(args)

    def snapshot() -> Any:
        try:
            return group_lag(admin, args.group, topics=args.topic, timeout=args.timeout)
        finally:
            admin.poll(0)  # hand the queued librdkafka log lines to the (quiet) logger

    if args.watch is None:
        try:
            lag = snapshot()
        except WeirError as exc:
            print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr)
            return 1
        _print_lag(lag, args)
        return 0
    try:
        if args.json:
            _watch_json(snapshot, args)
        else:
            _watch_table(snapshot, args)
    except KeyboardInterrupt:
        pass
    except BrokenPipeError:
        # The reader has taken what it wanted (`| head -3`): the end of a watch, like Ctrl-C.
        _discard_output()
    return 0


def _print_lag(lag: Any, args: argparse.Namespace) -> None:
    from weir.lag import lag_as_dict

    if args.json:
        print(json.dumps(lag_as_dict(lag)), flush=True)
    else:
        table_console().print(_lag_view(lag, args))


def _watch_json(snapshot: Callable[[], Any], args: argparse.Namespace) -> None:
    from weir.errors import WeirError

    while True:
        try:
            _print_lag(snapshot(), args)
        except WeirError as exc:
            print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr, flush=True)
        time.sleep(args.watch)


def _watch_table(snapshot: Callable[[], Any], args: argparse.Namespace) -> None:
    from rich.console import Group
    from rich.live import Live
    from rich.text import Text

    from weir.errors import WeirError

    console = table_console()

    def view() -> Any:
        stamp = Text(
            f"{time.strftime('%H:%M:%S')}, every {args.watch:g} s; Ctrl-C to stop", style="dim"
        )
        try:
            return Group(_lag_view(snapshot(), args), stamp)
        except WeirError as exc:
            return Group(Text(f"weir: {cluster_error_message(exc, args)}", style="red"), stamp)

    if not console.is_terminal:
        # Piped: a table per round, one after another (a live redraw only shows at the end).
        while True:
            console.print(view())
            console.print()
            time.sleep(args.watch)
    with Live(console=console, auto_refresh=False) as live:
        while True:
            live.update(view(), refresh=True)
            time.sleep(args.watch)


def _lag_view(lag: Any, args: argparse.Namespace) -> Any:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    hottest = lag.hottest
    heading = Text.assemble(
        ("group ", "dim"),
        (lag.group_id, "bold"),
        ("  state ", "dim"),
        lag.state,
        ("  type ", "dim"),
        lag.group_type + (" (simple)" if lag.simple else ""),
        ("  members ", "dim"),
        str(lag.members),
        ("  total lag ", "dim"),
        (str(lag.total_lag), "bold"),
    )
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name in ("TOPIC", "PARTITION", "COMMITTED", "LOG END", "LAG"):
        table.add_column(name, justify="left" if name == "TOPIC" else "right", no_wrap=True)
    table.add_column("", no_wrap=True)  # the hottest partition's mark
    for name in ("MEMBER", "CLIENT ID", "HOST"):
        table.add_column(name, overflow="fold")
    totals = lag.topic_lag()
    rows = list(lag.partitions)
    for index, p in enumerate(rows):
        hot = p is hottest
        table.add_row(
            p.topic,
            str(p.partition),
            number(p.committed),
            number(p.log_end),
            number(p.lag),
            "◀ hottest" if hot else "",
            p.member_id or "-",
            p.client_id or "-",
            p.host or "-",
            style="bold red" if hot else None,
        )
        last_of_topic = index + 1 == len(rows) or rows[index + 1].topic != p.topic
        if last_of_topic:
            table.add_row(
                Text(f"{p.topic} total", style="bold"),
                "",
                "",
                "",
                Text(str(totals[p.topic]), style="bold"),
                end_section=True,
            )
    if not rows:
        # Kafka leaves out the offsets of topics the client may not describe, without a word.
        return Group(
            heading,
            Text(
                "no partitions: the group has no offsets and no members (on the topics this "
                "client may describe)"
            ),
        )
    return Group(heading, table)


# --- entry point ---------------------------------------------------------------------------------

SUBCOMMANDS: dict[str, Registrar] = {
    "broker": _register_broker,
    "lag": _register_lag,
    "groups": register_groups,
    "offsets": register_offsets,
    "tail": tail.register,
    "dlq": dlq.register,
}


def build_parser() -> argparse.ArgumentParser:
    from weir import __version__

    parser = argparse.ArgumentParser(
        prog="weir", description="kafka-weir: consume Kafka with worker threads, losing nothing."
    )
    parser.add_argument("--version", action="version", version=f"weir {__version__}")
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


@contextlib.contextmanager
def _logging_to_stderr() -> Iterator[None]:
    """The command line is an application: it shows weir's info events on stderr (stdout
    carries results, e.g. the bootstrap address for scripts) while main() runs, and takes its
    handler away after, so calling main() in a process leaves that process's logging as it
    was."""
    weir_log = logging.getLogger("weir")
    handler = logging.StreamHandler(cast(TextIO, _CurrentStderr()))
    handler.setLevel(logging.INFO)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[
                structlog.stdlib.add_log_level,
                structlog.processors.TimeStamper(fmt="%Y-%m-%d %H:%M:%S", utc=False),
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.dev.ConsoleRenderer(
                    colors=sys.stderr.isatty() and "NO_COLOR" not in os.environ
                ),
            ]
        )
    )
    level = weir_log.level
    if level == logging.NOTSET or level > logging.INFO:
        weir_log.setLevel(logging.INFO)
    weir_log.addHandler(handler)
    try:
        yield
    finally:
        weir_log.removeHandler(handler)
        weir_log.setLevel(level)


# A reader that stops reading (`weir ... | head`): the exit status of a process that SIGPIPE
# ended, as `seq 1000000 | head -1` gives (Python ignores SIGPIPE, so it would be a traceback).
PIPE_CLOSED = 128 + signal.SIGPIPE
INTERRUPTED = 128 + signal.SIGINT


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parse(argv)  # --help and --version print here
        return _run(args)
    except BrokenPipeError:
        _discard_output()
        return PIPE_CLOSED
    except KeyboardInterrupt:  # what was started is stopped on the way out
        return INTERRUPTED
    except SystemError as exc:
        # Ctrl-C while a client call ran Python code of its own (confluent-kafka's admin calls):
        # the call returns with the KeyboardInterrupt set, and CPython raises this from it.
        if isinstance(exc.__cause__, KeyboardInterrupt):
            return INTERRUPTED
        raise


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; what no parser knows is refused by the command it was given to, with its
    usage and the closest option it has (argparse refused it with the top-level usage, `weir
    [-h] [--version] COMMAND ...`, and no hint)."""
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        names, command = _command_path(parser, args)
        args, unknown = _intermixed(command, argv[_after(argv, names) :], args, unknown)
        if unknown:
            command.error(
                f"unrecognized arguments: {' '.join(unknown)}{_closest(command, unknown)}"
            )
    resolve_group(args)
    return args


def _intermixed(
    command: argparse.ArgumentParser,
    own: list[str],
    args: argparse.Namespace,
    unknown: list[str],
) -> tuple[argparse.Namespace, list[str]]:
    """`weir groups describe -b HOST GROUP`: argparse fills a command's positionals from the
    first run of them it meets ("describe", and no group), and the group after the options was
    left over. The command's own arguments (`own`) parsed again with options and positionals
    mixed, as `parse_intermixed_args` does, place it; what is still left over is unknown."""
    try:
        again, rest = command.parse_known_intermixed_args(own)
    except TypeError:  # what intermixed parsing does not take: the first parse stands
        return args, unknown
    return argparse.Namespace(**{**vars(args), **vars(again)}), rest


def _after(argv: list[str], names: list[str]) -> int:
    """Where the innermost command's own arguments start: after its name, found in `argv`
    after its parents' (options before a name are its parent's)."""
    at = -1
    for name in names:
        at = argv.index(name, at + 1)
    return at + 1


def _command_path(
    parser: argparse.ArgumentParser, args: argparse.Namespace
) -> tuple[list[str], argparse.ArgumentParser]:
    """The (sub)command names `args` went through, outermost first, and the innermost
    command's parser."""
    names: list[str] = []
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen is None:
            return names, parser
        names.append(chosen)
        parser = subs[0].choices[chosen]


def _closest(parser: argparse.ArgumentParser, unknown: Sequence[str]) -> str:
    """` (did you mean --port?)` for the unknown options that are close to one of `parser`'s."""
    options = [o for o in parser._option_string_actions if o.startswith("--")]
    hints: dict[str, str] = {}
    for arg in unknown:
        name = arg.split("=", 1)[0]
        close = difflib.get_close_matches(name, options, n=1) if name.startswith("--") else []
        if close:
            hints[name] = close[0]
    if len(hints) == 1:
        return f" (did you mean {next(iter(hints.values()))}?)"
    return (
        " (" + "; ".join(f"{k}: did you mean {v}?" for k, v in hints.items()) + ")" if hints else ""
    )


def _run(args: argparse.Namespace) -> int:
    handler: Handler = args.handler
    from weir.testing.errors import HarnessError

    try:
        with _logging_to_stderr():
            code = handler(args)
            # Now rather than at exit, so that a reader that has gone is seen by main().
            sys.stdout.flush()
            return code
    except (HarnessError, UsageError) as exc:
        print(f"weir: {exc}", file=sys.stderr)
        return 1


def _discard_output() -> None:
    """Point stdout and stderr at /dev/null: the interpreter's last flush of what is still
    buffered for a closed pipe would print an error of its own."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(AttributeError, OSError, ValueError):
                os.dup2(devnull, stream.fileno())  # none under pytest's capture
    finally:
        os.close(devnull)


if __name__ == "__main__":
    sys.exit(main())
