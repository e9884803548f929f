"""The operator's calls on a running member, served on the owner thread: `retry_now` and
`skip` (`Failures`), `seek` (`Seeks`). Their arguments were checked in the caller's thread
(`GroupConsumer`); whatever serving one raises all the same goes to that call's future, never to
the loop (it would stop the member), except a transaction's failure, which stops the member as
it would at any commit."""

from __future__ import annotations

from weir._engine.failures import Failures
from weir._engine.lifecycle import Lifecycle
from weir._engine.seeking import Seeks
from weir._engine.transactions import TransactionError
from weir.records import Partition

__all__ = ["OperatorCalls"]


class OperatorCalls:
    """Owner thread only."""

    def __init__(self, life: Lifecycle, failures: Failures, seeks: Seeks) -> None:
        self._life = life
        self._failures = failures
        self._seeks = seeks

    def serve(self) -> None:
        for kind, args, future in self._life.take_requests():
            if not future.set_running_or_notify_cancel():
                continue
            try:
                tp = Partition(*args[0])
                result: object
                if kind == "retry_now":
                    result = self._failures.retry_now(tp)
                elif kind == "skip":
                    result = self._failures.skip(tp, args[1])
                elif kind == "seek":
                    result = self._seeks.seek(tp, args[1])
                else:
                    raise ValueError(f"unknown request {kind!r}")
            except TransactionError as exc:
                future.set_exception(exc)
                raise
            except Exception as exc:
                future.set_exception(exc)
            else:
                future.set_result(result)
