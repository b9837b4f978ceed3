"""Group configs (KIP-848): `kafka-configs --entity-type groups` sets a
consumer group's own `consumer.session.timeout.ms` and
`consumer.heartbeat.interval.ms`, DescribeConfigs on the GROUP resource
answers them as Apache Kafka 4.3.1 does (checked against it: every config
with its value, GROUP_CONFIG where the group sets it, else the broker's
`group.consumer.*` as DEFAULT_CONFIG, which is also its synonym), a
member's heartbeats follow them, and they survive a restart."""
from __future__ import annotations

import uuid

import config_wire
import consumer_group_wire as cg
from conftest import unique, wait_until
from test_broker_configs import refused
from test_operator_tools import kafka_configs

GROUP_CONFIG, DEFAULT_CONFIG = 8, 5
INT = 3


def group_configs(bootstrap: str, group: str) -> dict:
    answer = config_wire.describe_configs(bootstrap, config_wire.RESOURCE_GROUP, group)
    assert answer["error_code"] == 0, answer
    return answer["configs"]


def test_group_configs_are_set_described_and_kept(broker):
    bs = broker.bootstrap
    group = unique("gcfg")
    kafka_configs(bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                  "--add-config", "consumer.session.timeout.ms=50000")

    def check():
        configs = group_configs(bs, group)
        session = configs["consumer.session.timeout.ms"]
        assert (session["value"], session["source"], session["read_only"], session["type"]) == (
            "50000", GROUP_CONFIG, False, INT), session
        assert session["synonyms"] == [("consumer.session.timeout.ms", "50000", GROUP_CONFIG),
                                       ("group.consumer.session.timeout.ms", "45000", DEFAULT_CONFIG)], session
        interval = configs["consumer.heartbeat.interval.ms"]
        assert (interval["value"], interval["source"]) == ("5000", DEFAULT_CONFIG), interval
        assert interval["synonyms"] == [("group.consumer.heartbeat.interval.ms", "5000", DEFAULT_CONFIG)]
    check()
    broker.restart()
    check()

    # A group that sets nothing has the broker's values.
    other = group_configs(bs, unique("plain"))["consumer.session.timeout.ms"]
    assert (other["value"], other["source"]) == ("45000", DEFAULT_CONFIG), other

    for config, message in [
            ("consumer.session.timeout.ms=1000",
             "consumer.session.timeout.ms must be greater than or equal to group.consumer.min.session.timeout.ms"),
            ("consumer.heartbeat.interval.ms=50000",
             "consumer.heartbeat.interval.ms must be less than or equal to group.consumer.max.heartbeat.interval.ms"),
            ("consumer.session.timeout.ms=soon",
             "Invalid value soon for configuration consumer.session.timeout.ms: Not a number of type INT"),
            ("no.such.config=1", "Unknown group config name: no.such.config")]:
        out = refused(kafka_configs(bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                                    "--add-config", config, ok=False))
        assert "InvalidConfigurationException" in out and message in out, out[-3000:]

    kafka_configs(bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                  "--delete-config", "consumer.session.timeout.ms")
    session = group_configs(bs, group)["consumer.session.timeout.ms"]
    assert (session["value"], session["source"]) == ("45000", DEFAULT_CONFIG), session


def test_a_consumer_group_member_follows_its_groups_heartbeat_interval(shared_broker):
    bs = shared_broker.bootstrap
    group = unique("gcfg-hb")
    member = str(uuid.uuid4())
    # Kafka's coordinator may still be loading the offsets topic.
    wait_until(lambda: cg.find_coordinator(bs, group) == 0, 30, "the coordinator")
    first = wait_until(lambda: (j := cg.heartbeat(bs, group, member, 0, topics=["t"], owned=[]))["error"] == 0
                       and j, 30, "the member to join")
    assert (first["error"], first["interval"]) == (0, 5000), first
    kafka_configs(bs, "--alter", "--entity-type", "groups", "--entity-name", group,
                  "--add-config", "consumer.heartbeat.interval.ms=7000")
    again = cg.heartbeat(bs, group, first["member_id"], first["epoch"])
    assert (again["error"], again["interval"]) == (0, 7000), again
