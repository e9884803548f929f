"""`weir offsets` and `weir groups delete` on the secured broker: the -X settings reach every
client, the OffsetDelete one through librdkafka's C API too, and the ACLs operating.md names
are the ones the broker asks for."""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from tests.integration.secured import cli
from weir.testing.broker import EmbeddedKafka
from weir.testing.pytest_plugin import allow, commit_offsets, create_topic, produce
from weir.testing.security import ClientSettings

pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.timeout(120)]


def test_reset_and_deletes_with_the_acls_they_need(
    kafka_secure_broker: EmbeddedKafka,
    kafka_secure_admin: AdminClient,
    who: ClientSettings,
    principal: str,
    group: str,
    capsys: pytest.CaptureFixture[str],
    tmp_path: object,
) -> None:
    internal = kafka_secure_broker.internal_bootstrap_servers
    topic = create_topic(internal, partitions=2)
    produce(internal, topic, [(None, f"v{i}") for i in range(4)], partition=0)
    commit_offsets(internal, group, topic, {0: 3, 1: 0})
    allow(kafka_secure_admin, principal, topics=[topic])  # READ and DESCRIBE
    allow(kafka_secure_admin, principal, groups=[group], operations=["DESCRIBE"])
    reset = ("offsets", "reset", "-g", group, "-t", topic, "--to-earliest")
    code, _, err = cli(capsys, who, *reset, "--execute", "--save", f"{tmp_path}/refused.json")
    assert code == 1
    assert err.splitlines()[-1] == (
        "weir: authorization failed: the broker's ACLs do not allow this client READ on group "
        f"{group!r} (GROUP_AUTHORIZATION_FAILED: Broker: Group authorization failed): resetting "
        "a group's offsets needs READ on the group and on the topic"
    ), err
    allow(kafka_secure_admin, principal, groups=[group], operations=["READ"])

    save = f"{tmp_path}/saved.json"
    code, out, err = cli(capsys, who, *reset, "--execute", "--save", save)
    assert code == 0, err
    code, out, err = cli(capsys, who, "offsets", "reset", "-g", group, "--from-file", save)
    assert code == 0, err  # a dry run of the undo: 0 back to 3

    delete = ("offsets", "delete", "-g", group, "-t", topic)
    code, _, err = cli(capsys, who, *delete)
    assert code == 1
    assert err.startswith(
        "weir: authorization failed: the broker's ACLs do not allow this client DELETE on group "
        f"{group!r} (GROUP_AUTHORIZATION_FAILED: "
    ), err
    assert err.endswith(
        "): deleting a group's offsets needs DELETE on the group and READ on the topic\n"
    )
    assert err.count("\n") == 1
    allow(kafka_secure_admin, principal, groups=[group], operations=["DELETE"])
    code, out, err = cli(capsys, who, *delete)
    assert code == 0, err
    assert out == f"deleted the committed offsets of group {group!r} on {topic} (partitions 0, 1)\n"

    commit_offsets(internal, group, topic, {1: 1})
    code, out, err = cli(capsys, who, "groups", "delete", group)
    assert (code, out) == (0, f"deleted group {group!r} and its committed offsets\n"), err
