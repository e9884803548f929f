"""Every error weir raises is defined once, in weir.errors (the harness's in
weir.testing.errors), and the import paths the docs name are that same class."""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType

import pytest

import weir
import weir.errors
from weir.lag import admin_client, topic_partitions
from weir.testing.errors import BrokerStartError, PostgresStartError

# Private signals that never leave their module (or, for CallAbandoned, the two engine modules
# that bound a client call; for _TokenProblem, the token provider's wrapper and the start that
# asks it first; for UsageError, the commands of weir.cli and its main()), so no caller ever
# catches them.
INTERNAL = {
    ("weir._engine.bounded", "CallAbandoned"),
    ("weir._engine.stalls", "_Unplaced"),
    ("weir.config", "_TokenProblem"),
    ("weir._cli.usage", "UsageError"),
    ("weir.fencing.sqlite", "_Replay"),
    ("weir.offsetmap", "_Corrupt"),
}


def weir_modules() -> list[ModuleType]:
    return [importlib.import_module(m.name) for m in pkgutil.walk_packages(weir.__path__, "weir.")]


def test_every_exception_class_is_defined_in_an_errors_module() -> None:
    """weir.lag had its own BrokerUnreachableError, BrokerRefusedError, AuthenticationError and
    TlsError: `except weir.BrokerUnreachableError` missed a lag call's unreachable broker."""
    elsewhere = sorted(
        {
            (obj.__module__, obj.__qualname__)
            for module in weir_modules()
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, BaseException)
            and obj.__module__.startswith("weir.")
            and obj.__module__ not in ("weir.errors", "weir.testing.errors")
        }
        - INTERNAL
    )
    assert elsewhere == []


def test_each_concept_has_one_class() -> None:
    names = [
        obj.__qualname__
        for module in (weir.errors, importlib.import_module("weir.testing.errors"))
        for obj in vars(module).values()
        if isinstance(obj, type) and issubclass(obj, BaseException)
        if obj.__module__ == module.__name__
    ]
    assert len(names) == len(set(names)), sorted(names)


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("weir", "BrokerUnreachableError"),
        ("weir", "NonRetryable"),
        ("weir", "DeadLetterError"),
        ("weir", "TransactionError"),
        ("weir.policy", "NonRetryable"),
        ("weir.fencing", "FenceUnavailableError"),
        ("weir.fencing", "NoEpochError"),
        ("weir.errors", "AwaitableReturned"),
        ("weir.errors", "GeneratorReturned"),
        ("weir.lag", "LagError"),
        ("weir.lag", "GroupNotFoundError"),
        ("weir.lag", "TopicNotFoundError"),
        ("weir.lag", "BrokerUnreachableError"),
        ("weir.lag", "BrokerRefusedError"),
        ("weir.lag", "AuthenticationError"),
        ("weir.lag", "TlsError"),
        ("weir.admin", "GroupActiveError"),
        ("weir.admin", "OffsetsError"),
    ],
)
def test_the_documented_import_paths_name_the_same_class(module: str, name: str) -> None:
    assert getattr(importlib.import_module(module), name) is getattr(weir.errors, name)


@pytest.mark.parametrize(
    ("module", "name"),
    [("weir.testing", "BrokerStartError"), ("weir.testing.postgres", "PostgresStartError")],
)
def test_the_harness_errors_keep_their_import_paths(module: str, name: str) -> None:
    errors = importlib.import_module("weir.testing.errors")
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)


def test_a_lag_call_with_no_broker_raises_the_members_error() -> None:
    """One BrokerUnreachableError for the member and weir.lag: code that handles an unreachable
    broker handles both, and a lag call's still says how long it waited and why."""
    admin = admin_client({"bootstrap.servers": "127.0.0.1:1"})
    with pytest.raises(weir.BrokerUnreachableError) as raised:
        topic_partitions(admin, "t", timeout=0.5)
    assert isinstance(raised.value, weir.WeirError)
    assert raised.value.timeout == 0.5
    assert raised.value.reason
    assert str(raised.value).startswith("no broker answered within 0.5 s (")


def test_a_server_that_did_not_start_shows_the_tail_of_its_log() -> None:
    assert str(BrokerStartError("no broker", "tail")) == (
        "no broker\n--- last lines of the broker log ---\ntail"
    )
    assert str(PostgresStartError("no server", "tail")) == (
        "no server\n--- last lines of the PostgreSQL log ---\ntail"
    )
    assert str(PostgresStartError("no server")) == "no server"
