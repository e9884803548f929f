"""At-least-once outputs under kill -9: members transform a steady stream with `ctx.produce`
and no `transactional_id`, and members are SIGKILLed right after handing an output to
librdkafka, before its delivery report (tests.audit.member.DyingOutputs). weir counts a record
finished only once its outputs are confirmed, so no commit passed a record whose output died
with the process: once the group's commits reach the input's end, the output topic holds the
transform of every input at least once (duplicates allowed: at-least-once). Marked slow and
chaos like the other chaos runs (`make chaos`); the seed is printed (WEIR_CHAOS_SEED)."""

from __future__ import annotations

import os
import random
import time
import uuid
from pathlib import Path

import pytest

from tests.audit import check
from tests.audit.cluster import Members, SteadyProducer
from tests.audit.exactly_once import check_outputs
from tests.integration.kafka_helpers import committed
from weir.testing.pytest_plugin import TopicFactory

PARTITIONS = 8
SECONDS = float(os.environ.get("WEIR_CHAOS_SECONDS_OUTPUTS", "20"))


@pytest.mark.broker
@pytest.mark.chaos
@pytest.mark.slow
@pytest.mark.timeout(400)
def test_outputs_survive_members_killed_between_produce_and_delivery(
    kafka_bootstrap: str, make_topic: TopicFactory, tmp_path: Path
) -> None:
    seed = int(os.environ.get("WEIR_CHAOS_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"\noutputs chaos seed={seed} seconds={SECONDS}")
    src, out = make_topic(PARTITIONS), make_topic(PARTITIONS)
    group = f"alo-chaos-{uuid.uuid4().hex[:8]}"
    members = Members(tmp_path, kafka_bootstrap, group, src, "cooperative")
    producer = SteadyProducer(kafka_bootstrap, src, rate=250)
    actions: list[str] = []
    dying: set[str] = set()
    serial = 0

    def spawn(die: bool) -> None:
        nonlocal serial
        serial += 1
        name = f"m{serial}"
        extra = ["--alo-output", out, "--slow-ms", str(rng.choice([1, 2, 5]))]
        if die:
            at = rng.randint(20, 600)
            extra += ["--die-at-produce", str(at)]
            dying.add(name)
            actions.append(f"start {name} (dies after output {at})")
        members.start(name, *extra)

    producer.start()
    try:
        spawn(die=False)
        spawn(die=True)
        spawn(die=True)
        deadline = time.monotonic() + SECONDS
        while time.monotonic() < deadline:
            time.sleep(rng.uniform(0.5, 2.0))
            for name in members.reap(dying):
                actions.append(f"{name} killed after an output")
                spawn(die=rng.random() < 0.7)
        ends = members.wind_down(
            producer,
            dying,
            lambda: spawn(die=False),
            lambda: committed(kafka_bootstrap, group, src, PARTITIONS),
            kafka_bootstrap,
            src,
            PARTITIONS,
        )
    finally:
        members.close()
        if producer.is_alive():
            producer.finish()
    report = check_outputs(kafka_bootstrap, src, out)
    audit = check(members.events(), ends)
    kills = sum(1 for e in members.events() if e["ev"] == "killed_after_produce")
    print(f"outputs chaos: kills={kills} {report.summary()}; {audit.summary()}")
    print(f"actions={actions}")
    assert kills > 0, f"seed={seed}: no member was killed after an output"
    assert not report.missing, f"seed={seed}: {report.summary()}"
    assert not report.unexpected, f"seed={seed}: {report.summary()}"
    assert not audit.violations, f"seed={seed}\n" + "\n".join(audit.violations[:20])
