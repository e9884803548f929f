"""Connection options, settings and the admin client that every cluster command shares
(`weir lag`, `weir groups`, and the commands that change a group's offsets)."""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import Any

from weir._cli.usage import UsageError

ENV_BOOTSTRAP = "WEIR_BOOTSTRAP_SERVERS"
ADMIN_TIMEOUT_S = 5.0
# librdkafka's own log lines (a refused connection is logged on every retry, hundreds per run):
# routed through Python logging by the admin client's `logger` setting, and kept quiet here.
KAFKA_LOG = "weir.cli.kafka"


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    bootstrap = os.environ.get(ENV_BOOTSTRAP, "").strip()
    parser.add_argument(
        "--bootstrap-servers",
        "-b",
        default=bootstrap or None,
        required=not bootstrap,
        metavar="HOST:PORT[,...]",
        help=f"the cluster (default: ${ENV_BOOTSTRAP})",
    )
    parser.add_argument(
        "--config",
        "-X",
        action="append",
        default=[],
        type=parse_setting,
        metavar="KEY=VALUE",
        help="librdkafka client setting, repeatable (e.g. security.protocol=SASL_SSL)",
    )
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=ADMIN_TIMEOUT_S,
        metavar="SECONDS",
        help=f"give up when the cluster does not answer within this (default {ADMIN_TIMEOUT_S:g})",
    )
    parser.add_argument(
        "--json", action="store_true", help="machine-readable JSON on stdout, one object a line"
    )


# -X settings the command sets itself: a second value would be dropped without a word.
OWN_SETTINGS = {
    "bootstrap.servers": "use --bootstrap-servers/-b",
    "metadata.broker.list": "use --bootstrap-servers/-b",
    "logger": "weir routes librdkafka's log lines itself",
}


def parse_setting(item: str) -> tuple[str, str]:
    from weir._secrets import is_secret_key

    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        # Without its `=`, the item may be a secret's name run into its value.
        shown = "an item not shown (it names a secret)" if is_secret_key(item) else repr(item)
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {shown}")
    key = key.strip()
    if key in OWN_SETTINGS:
        raise argparse.ArgumentTypeError(f"{key} is not a -X setting: {OWN_SETTINGS[key]}")
    return key, value.strip()


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text!r}")
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number of seconds, got {text!r}")
    return value


def admin_for(args: argparse.Namespace) -> Any:
    from weir.lag import admin_client

    kafka_log = logging.getLogger(KAFKA_LOG)
    kafka_log.setLevel(logging.CRITICAL)
    kafka_log.propagate = False
    settings = dict(args.config)
    config: dict[str, Any] = {
        **settings,
        "bootstrap.servers": args.bootstrap_servers,
        "logger": kafka_log,
    }
    try:
        return admin_client(config)
    except Exception as exc:  # whatever the client raises while it is built is its refusal
        raise UsageError(refusal(exc, settings)) from None


def on_cluster(args: argparse.Namespace, work: Callable[[Any], int]) -> int:
    """``work(admin)`` with the admin client ``args`` ask for: a ``WeirError`` it raises is one
    line on stderr and exit status 1."""
    from weir.errors import WeirError

    admin = admin_for(args)
    try:
        return work(admin)
    except WeirError as exc:
        print(f"weir: {cluster_error_message(exc, args)}", file=sys.stderr)
        return 1
    finally:
        admin.poll(0)  # hand the queued librdkafka log lines to the (quiet) logger


def refusal(exc: Exception, settings: dict[str, str]) -> str:
    """librdkafka's reason for refusing the -X settings, without the value of a secret."""
    from weir._secrets import is_secret_key
    from weir.lag import error_text

    reason = error_text(exc).removeprefix("Failed to create admin client: ")
    for key, value in settings.items():
        if is_secret_key(key) and value:
            reason = reason.replace(value, "***")
    return f"the client refuses the -X settings: {reason}"


def cluster_error_message(exc: Exception, args: argparse.Namespace) -> str:
    from weir.errors import BrokerRefusedError, BrokerUnreachableError

    if isinstance(exc, BrokerRefusedError):
        return str(exc)  # names the broker, what it refused and the -X settings to check
    if isinstance(exc, BrokerUnreachableError):
        waited = args.timeout if exc.timeout is None else exc.timeout
        return (
            f"no Kafka broker answered at {args.bootstrap_servers} within {waited:g} s "
            f"({exc.reason or 'no answer'}); check --bootstrap-servers, or raise --timeout"
        )
    return f"{exc} (cluster {args.bootstrap_servers})"
