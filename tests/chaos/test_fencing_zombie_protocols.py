"""The zombie test (tests/integration/test_fencing_zombie.py) under the other group protocols:
cooperative-sticky and KIP-848 (whose session timeout is the broker's, 6 s on the embedded
broker), on SQLite and PostgreSQL. Part of `make chaos`, not of `make test`: the eager run in the
integration suite covers the fence; these cover how each protocol loses and hands over."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.integration.test_fencing_zombie import (
    Database,
    check_late_writes_refused,
    run_zombie,
)
from weir.testing.pytest_plugin import TopicFactory


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize("protocol", ["cooperative", "consumer"])
@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
)
def test_a_zombies_late_write_is_refused_under_each_protocol(
    kafka_bootstrap: str,
    make_topic: TopicFactory,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    protocol: str,
    backend: str,
) -> None:
    prefix = f"z{uuid.uuid4().hex[:10]}"
    if backend == "sqlite":
        db = Database(backend, str(tmp_path / "ledger.db"), prefix)
        where = "before"
    else:
        db = Database(backend, request.getfixturevalue("postgres_dsn"), prefix)
        where = "inside"
    db.create()
    try:
        out = run_zombie(kafka_bootstrap, make_topic(1), tmp_path, db, where, protocol)
        check_late_writes_refused(out)
        out.check_exactly_once()
    finally:
        if backend == "postgres":
            db.drop()
