"""Members and `weir` commands connected to the secured session broker as a production client
is: the settings of a `ClientSettings` (bootstrap servers, TLS files, SASL), nothing else."""

from __future__ import annotations

from typing import Any

import pytest

from weir import GroupConsumer, Handler, Record
from weir.cli import main
from weir.records import Context
from weir.testing.security import ClientSettings

STARTUP_TIMEOUT_S = 20.0


def member(
    settings: ClientSettings, handler: Any, conf: dict[str, Any] | None = None, **options: Any
) -> GroupConsumer:
    """A member logging in with `settings` (or with `conf`, its configuration made otherwise:
    a token provider's)."""
    kafka: dict[str, Any] = dict(settings.config() if conf is None else conf)
    return GroupConsumer(
        handler,
        bootstrap_servers=kafka.pop("bootstrap.servers"),
        kafka=kafka,
        startup_timeout_s=STARTUP_TIMEOUT_S,
        **options,
    )


def cli(
    capsys: pytest.CaptureFixture[str], settings: ClientSettings, *argv: str
) -> tuple[int, str, str]:
    """`weir *argv` with `settings` as -b and -X options: exit code, stdout, stderr."""
    conf = settings.config()
    args = ["-b", conf.pop("bootstrap.servers")]
    for key, value in conf.items():
        args += ["-X", f"{key}={value}"]
    code = main([*argv, *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


class Forward(Handler):
    """An exactly-once handler: each record to `output`, in the member's transaction."""

    def __init__(self, output: str) -> None:
        self.output = output

    def handle(self, record: Record, ctx: Context) -> None:
        ctx.produce(self.output, record.value, record.key)
