"""The requests other threads send the owner: an operator's `retry_now`, `skip` and `seek`,
and the application's `pause` and `resume` (`GroupConsumer`'s methods).

Their arguments were checked in the caller's thread; whatever serving one raises all the same
goes to that request's future, never to the owner loop (it would stop the member), except a
transaction's failure (a seek in exactly-once mode commits the open transaction first), which
stops the member as it would at any commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from weir._engine.app_pauses import AppPauses, Target
from weir._engine.failures import Failures
from weir._engine.lifecycle import Lifecycle
from weir._engine.seeking import Seeks
from weir._engine.transactions import TransactionError
from weir.records import Partition

__all__ = ["Requests"]


class Requests:
    """Owner thread only."""

    def __init__(
        self, life: Lifecycle, failures: Failures, pauses: AppPauses, seeks: Seeks
    ) -> None:
        self._life = life
        self._serve: dict[str, Callable[..., object]] = {
            "retry_now": lambda tp: failures.retry_now(Partition(*tp)),
            "skip": lambda tp, offset: failures.skip(Partition(*tp), offset),
            "pause": lambda target, for_s: pauses.pause(_target(target), for_s),
            "resume": lambda target: pauses.resume(_target(target)),
            "seek": lambda tp, to: seeks.seek(Partition(*tp), to),
        }

    def serve(self) -> None:
        for kind, args, future in self._life.take_requests():
            if not future.set_running_or_notify_cancel():
                continue
            try:
                serve = self._serve.get(kind)
                if serve is None:
                    raise ValueError(f"unknown request {kind!r}")
                result = serve(*args)
            except TransactionError as exc:
                future.set_exception(exc)
                raise
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)


def _target(value: Any) -> Target:
    return value if isinstance(value, str) else Partition(*value)
