"""Random kill/restart of four audited members under a steady stream.

Both run in `make chaos` (marked `slow`: a minute for the short run is more than `make test`
can spend on one scenario; tests/integration/test_rebalance.py has its joins, leaves, kills and
freezes): the short one for 45 s, the long one for each protocol for longer (WEIR_CHAOS_SECONDS).
The seed is printed so a failure can be replayed (WEIR_CHAOS_SEED).
WEIR_CHAOS_ORDERING (key, partition, unordered; key by default) picks the members' ordering and
WEIR_CHAOS_OFFSET_MAP=0 runs them without offset maps, to compare the duplicates each run prints;
WEIR_CHAOS_RATE sets the records per second produced (250: the members keep up; above about 1000
they fall behind), and WEIR_CHAOS_STALL="N:MS" makes every Nth offset of a partition take MS ms,
so that records finished above a slow one wait above the committed offset.
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
from weir.testing.pytest_plugin import TopicFactory

PARTITIONS = 8
# The long run's chaos phase; the wind-down after it may take up to 120 s more (Members.finish).
LONG_SECONDS = float(os.environ.get("WEIR_CHAOS_SECONDS", "300"))
ORDERING = os.environ.get("WEIR_CHAOS_ORDERING", "key")
OFFSET_MAP = os.environ.get("WEIR_CHAOS_OFFSET_MAP", "1") != "0"


def _rate(text: str) -> float:
    """WEIR_CHAOS_RATE: records per second the producer sends, > 0."""
    try:
        rate = float(text)
    except ValueError:
        rate = 0.0
    if not rate > 0:
        raise ValueError(f"WEIR_CHAOS_RATE must be a number > 0, got {text!r}")
    return rate


def _stall(text: str) -> tuple[int, float] | None:
    """WEIR_CHAOS_STALL "N:MS": every Nth offset of a partition takes MS ms (a slow record the
    others overtake); empty: none."""
    if not text:
        return None
    every, _, ms = text.partition(":")
    try:
        n, t = int(every), float(ms)
    except ValueError:
        n, t = 0, 0.0
    if n < 1 or not t > 0:
        raise ValueError(f"WEIR_CHAOS_STALL must be N:MS with N >= 1 and MS > 0, got {text!r}")
    return n, t


# Read at import, so that a bad value stops the run before any member starts.
RATE = _rate(os.environ.get("WEIR_CHAOS_RATE", "250"))
STALL = _stall(os.environ.get("WEIR_CHAOS_STALL", ""))
STALL_TEXT = f"{STALL[0]}:{STALL[1]:g}" if STALL else None


def _chaos(bootstrap: str, topic: str, workdir: Path, protocol: str, seconds: float) -> None:
    seed = int(os.environ.get("WEIR_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(
        f"\nchaos seed={seed} protocol={protocol} seconds={seconds} rate={RATE:g} "
        f"stall={STALL_TEXT} ordering={ORDERING} offset_map={OFFSET_MAP}"
    )
    group = f"chaos-{uuid.uuid4().hex[:8]}"
    members = Members(workdir, bootstrap, group, topic, protocol)
    producer = SteadyProducer(bootstrap, topic, rate=RATE)
    actions: list[str] = []
    serial = 0

    def spawn() -> None:
        nonlocal serial
        serial += 1
        extra = ["--ordering", ORDERING] + ([] if OFFSET_MAP else ["--no-offset-map"])
        if STALL:
            extra += ["--stall-every", str(STALL[0]), "--stall-ms", f"{STALL[1]:g}"]
        members.start(f"m{serial}", "--slow-ms", str(rng.choice([1, 5, 20])), *extra)

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
    evs = members.events()
    report = check(evs, ends)
    skipped = _skipped(evs)
    print(
        f"chaos {protocol} rate={RATE:g} stall={STALL_TEXT} ordering={ORDERING} "
        f"offset_map={OFFSET_MAP}: {report.summary()} "
        f"replay_skipped={skipped} actions={actions}"
    )
    assert not report.violations, f"seed={seed}\n" + "\n".join(report.violations[:20])
    assert committed(bootstrap, group, topic, PARTITIONS) == ends, f"seed={seed}"


def _skipped(evs: list[dict[str, Any]]) -> int:
    """Records the members did not handle again thanks to an offset map (each member's last
    stats; a killed member's are from its last confirmed commit)."""
    last: dict[str, int] = {}
    for e in evs:
        if e["ev"] == "stats":
            last[e["m"]] = e["skipped"]
    return sum(last.values())


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
def test_chaos_short(kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path) -> None:
    _chaos(kafka_bootstrap, make_topic(PARTITIONS), tmp_path, "cooperative", seconds=45)


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(LONG_SECONDS + 240)  # the suite's 300 s cut the default run short
@pytest.mark.parametrize("protocol", ["eager", "cooperative", "consumer"])
def test_chaos_long(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path, protocol: str
) -> None:
    _chaos(kafka_bootstrap, make_topic(PARTITIONS), tmp_path, protocol, seconds=LONG_SECONDS)
