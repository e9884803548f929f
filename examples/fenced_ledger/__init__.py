"""Account balances from a topic of transfers, exact under rebalances, replays and zombies.

Each record is a transfer ``{"id": ..., "from": account, "to": account, "amount": cents}``.
`LedgerHandler` applies it with `weir.fencing`: one database transaction debits one account,
credits the other and records the transfer, fenced by the partition's epoch and idempotent by
the record's event id. See README.md; ``python -m examples.fenced_ledger`` runs the demo.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from weir import Record
from weir.fencing import Fence, FencedHandler

__all__ = [
    "OPENING_BALANCE",
    "SCHEMA",
    "LedgerHandler",
    "Transfer",
    "expected_balances",
    "random_transfers",
]

OPENING_BALANCE = 100_000  # cents, per account

# Plain SQL that SQLite and PostgreSQL both take.
SCHEMA = [
    "CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
    # One row per application of a transfer, deliberately without a unique key: a transfer
    # applied twice would show here (the fence's own table is what prevents it).
    "CREATE TABLE IF NOT EXISTS postings "
    "(event_id TEXT NOT NULL, transfer_id TEXT NOT NULL, member TEXT NOT NULL)",
]


@dataclass(frozen=True)
class Transfer:
    id: str
    source: str
    target: str
    amount: int

    def to_json(self) -> bytes:
        return json.dumps(
            {"id": self.id, "from": self.source, "to": self.target, "amount": self.amount}
        ).encode()

    @classmethod
    def from_record(cls, record: Record) -> Transfer:
        v = json.loads(record.value or b"{}")
        return cls(str(v["id"]), str(v["from"]), str(v["to"]), int(v["amount"]))


def random_transfers(
    n: int, accounts: list[str], rng: random.Random, start: int = 0
) -> list[Transfer]:
    out = []
    for i in range(start, start + n):
        source, target = rng.sample(accounts, 2)
        out.append(Transfer(f"t-{i:06d}", source, target, rng.randint(1, 5_000)))
    return out


def expected_balances(accounts: Iterable[str], transfers: Iterable[Transfer]) -> dict[str, int]:
    """The balances after exactly one application of every transfer."""
    balances = dict.fromkeys(accounts, OPENING_BALANCE)
    for t in transfers:
        balances[t.source] -= t.amount
        balances[t.target] += t.amount
    return balances


class LedgerHandler(FencedHandler[Any]):
    """One transfer, one fenced transaction: debit, credit, posting.

    ``FencedHandler.handle`` calls ``write`` through ``fence.apply(group_id, record,
    ctx.epoch, ...)``: the fence checks the partition's epoch and records the event id in the
    same transaction, so a replay (the event id is there) is a no-op that does not call
    ``write``, and a member that lost the partition gets ``FencedError`` and changes nothing.
    """

    def __init__(self, fence: Fence[Any], group_id: str, member: str, *, postgres: bool) -> None:
        super().__init__(fence, group_id)
        self.member = member
        self.mark = "%s" if postgres else "?"

    def write(self, conn: Any, record: Record) -> None:
        t = Transfer.from_record(record)
        m = self.mark
        # Accounts in a fixed order: two transfers between the same accounts in opposite
        # directions lock the rows in the same order, so PostgreSQL never sees a deadlock.
        for account, delta in sorted([(t.source, -t.amount), (t.target, t.amount)]):
            conn.execute(
                f"UPDATE accounts SET balance = balance + {m} WHERE id = {m}", (delta, account)
            )
        conn.execute(
            f"INSERT INTO postings (event_id, transfer_id, member) VALUES ({m}, {m}, {m})",
            (record.event_id, t.id, self.member),
        )
