"""Random kill/restart of four audited members under a steady stream.

The short run is part of `make test`; the long one (`-m slow`, length from WEIR_CHAOS_SECONDS)
runs each protocol for longer. The seed is printed so a failure can be replayed (WEIR_CHAOS_SEED).
"""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.audit import check
from tests.audit.cluster import Members, SteadyProducer
from tests.integration.kafka_helpers import committed

PARTITIONS = 8
# The long run's chaos phase; the wind-down after it may take up to 120 s more (Members.finish).
LONG_SECONDS = float(os.environ.get("WEIR_CHAOS_SECONDS", "300"))


def _chaos(bootstrap: str, topic: str, workdir: Path, protocol: str, seconds: float) -> None:
    seed = int(os.environ.get("WEIR_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"\nchaos seed={seed} protocol={protocol} seconds={seconds}")
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    members = Members(workdir, bootstrap, group, topic, protocol)
    producer = SteadyProducer(bootstrap, topic, rate=250)
    actions: list[str] = []
    serial = 0

    def spawn() -> None:
        nonlocal serial
        serial += 1
        members.start(f"m{serial}", "--slow-ms", str(rng.choice([1, 5, 20])))

    producer.start()
    try:
        for _ in range(4):
            spawn()
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(1.0, 4.0))
            victim = rng.choice(sorted(members.procs))
            if rng.random() < 0.6:
                members.kill(victim)
                actions.append(f"kill {victim}")
            else:
                members.stop(victim)
                actions.append(f"stop {victim}")
            spawn()
        ends = members.finish(producer, bootstrap, topic, PARTITIONS, timeout=120)
    finally:
        members.close()
        if producer.is_alive():
            producer.finish()
    report = check(members.events(), ends)
    print(f"chaos {protocol}: {report.summary()} actions={actions}")
    assert not report.violations, f"seed={seed}\n" + "\n".join(report.violations[:20])
    assert committed(bootstrap, group, topic, PARTITIONS) == ends, f"seed={seed}"


@pytest.mark.broker
@pytest.mark.chaos
def test_chaos_short(kafka_bootstrap: str, make_topic: Any, tmp_path: Path) -> None:
    _chaos(kafka_bootstrap, make_topic(PARTITIONS), tmp_path, "cooperative", seconds=45)


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(LONG_SECONDS + 240)  # the suite's 300 s cut the default run short
@pytest.mark.parametrize("protocol", ["eager", "cooperative", "consumer"])
def test_chaos_long(kafka_bootstrap: str, make_topic: Any, tmp_path: Path, protocol: str) -> None:
    _chaos(kafka_bootstrap, make_topic(PARTITIONS), tmp_path, protocol, seconds=LONG_SECONDS)
