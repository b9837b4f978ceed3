"""Dynamic broker configs: `kafka-configs --entity-type brokers` (Apache
Kafka's ConfigCommand from the 4.3.1 jars) and confluent-kafka's
AdminClient against Keel. A change to this broker (`--entity-name 1`) or to
the cluster default (`--entity-default`) is in force at once (the request
paths, the open logs, Keel's budgets), survives a kill -9, and is refused
as Kafka refuses it when the key cannot change at run time."""
from __future__ import annotations

import json
import re
import socket
import urllib.request

import pytest
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource, ConfigSource,
                                   ResourceType)

import config_wire
from conftest import IMPL, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_hardening import failpoint
from test_operator_tools import clear_failpoints, delivery_errors, kafka_configs

BROKER = ("--entity-type", "brokers", "--entity-name", "1")
DEFAULT = ("--entity-type", "brokers", "--entity-default")


def described(bootstrap: str, *entity: str, all_configs: bool = False) -> dict[str, tuple[str, str]]:
    """`kafka-configs --describe` -> {key: (value, synonyms)}."""
    done = kafka_configs(bootstrap, "--describe", *entity, *(["--all"] if all_configs else []))
    out = {}
    for line in done.stdout.splitlines():
        m = re.match(r"^  (\S+?)=(.*?) sensitive=\w+ synonyms=\{(.*)\}$", line)
        if m:
            out[m.group(1)] = (m.group(2), m.group(3))
    return out


def stats(b) -> dict:
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=CLIENT_TIMEOUT_S) as r:
        return json.loads(r.read())


def refused(done) -> str:
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    return out


def test_kafka_configs_alters_broker_configs_in_force_at_once_and_after_a_kill(broker_factory):
    """The cluster default and this broker's own value of a topic default:
    the produce path sees message.max.bytes at once, an existing topic's
    open log rolls at the new log.segment.bytes, the broker's value wins
    over the default over the config file (the synonyms say so), both are
    there after a kill -9, and deleting one goes back to the next."""
    b = broker_factory({"message.max.bytes": "2000000"})
    topic = unique("dyn")
    create_topic(b.bootstrap, topic, 1)
    kafka_configs(b.bootstrap, "--alter", *DEFAULT, "--add-config", "message.max.bytes=4000,log.segment.bytes=20000")
    default = described(b.bootstrap, *DEFAULT)
    assert default.keys() == {"message.max.bytes", "log.segment.bytes"}, default
    assert default["message.max.bytes"] == ("4000", "DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes=4000"), default

    [err] = delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)])
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    assert delivery_errors(b.bootstrap, topic, [(b"k%d" % i, b"y" * 3000) for i in range(20)]) == [None] * 20
    segments = list((b.data_dir / f"{topic}-0").glob("*.log"))
    assert len(segments) >= 3, f"20 x 3 KB at log.segment.bytes=20000 rolled into {len(segments)} segment(s)"

    kafka_configs(b.bootstrap, "--alter", *BROKER, "--add-config", "message.max.bytes=8000")
    assert delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)]) == [None]
    mine = described(b.bootstrap, *BROKER)
    assert mine["message.max.bytes"][0] == "8000", mine
    assert mine["message.max.bytes"][1] == (
        "DYNAMIC_BROKER_CONFIG:message.max.bytes=8000, DYNAMIC_DEFAULT_BROKER_CONFIG:message.max.bytes=4000, "
        "STATIC_BROKER_CONFIG:message.max.bytes=2000000, DEFAULT_CONFIG:message.max.bytes=1048588"), mine
    # The topic's config follows, its source the broker's.
    topic_all = described(b.bootstrap, "--entity-type", "topics", "--entity-name", topic, all_configs=True)
    assert topic_all["max.message.bytes"][0] == "8000", topic_all["max.message.bytes"]
    assert topic_all["max.message.bytes"][1].startswith("DYNAMIC_BROKER_CONFIG:message.max.bytes=8000")

    b.kill9()
    b.start()
    assert described(b.bootstrap, *DEFAULT) == default
    assert described(b.bootstrap, *BROKER)["message.max.bytes"] == mine["message.max.bytes"]
    assert delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)]) == [None]

    kafka_configs(b.bootstrap, "--alter", *BROKER, "--delete-config", "message.max.bytes")
    assert described(b.bootstrap, *BROKER) == {}
    [err] = delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)])
    assert err is not None and err.code() == KafkaError.MSG_SIZE_TOO_LARGE, err
    kafka_configs(b.bootstrap, "--alter", *DEFAULT, "--delete-config", "message.max.bytes,log.segment.bytes")
    assert described(b.bootstrap, *DEFAULT) == {}
    assert delivery_errors(b.bootstrap, topic, [(b"big", b"x" * 6000)]) == [None]


def test_broker_configs_that_cannot_change_are_refused_as_kafka_does(broker):
    """As Apache Kafka 4.3.1 answers (checked against it): a static key is
    refused for the whole resource with INVALID_REQUEST and Kafka's message;
    a bad value and a value that conflicts with the rest get INVALID_REQUEST
    naming the key and value. Keel also refuses keys it does not have
    (Kafka stores them);
    DescribeConfigs marks the static keys read-only; validate_only and a
    refused change leave everything as it was."""
    done = kafka_configs(broker.bootstrap, "--alter", *DEFAULT, "--add-config",
                         "log.dirs=/elsewhere,log.retention.ms=1000", ok=False)
    out = refused(done)
    assert "InvalidRequestException" in out and "Cannot update these configs dynamically: [log.dirs]" in out, out
    for config in ("keel.cold.read.bytes.per.sec=fast", "log.cleaner.threads=0", "no.such.config=1",
                   "log.cleaner.dedupe.buffer.size=60000"):
        out = refused(kafka_configs(broker.bootstrap, "--alter", *BROKER, "--add-config", config, ok=False))
        assert "InvalidRequestException" in out and config.split("=")[0] in out, out[-3000:]
    out = refused(kafka_configs(broker.bootstrap, "--alter", *DEFAULT, "--add-config", "log.retention.ms=soon",
                                ok=False))
    assert "Invalid value soon for configuration log.retention.ms" in out, out[-3000:]
    assert described(broker.bootstrap, *DEFAULT) == {} and described(broker.bootstrap, *BROKER) == {}

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    res = ConfigResource(ResourceType.BROKER, "1")
    entries = admin.describe_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert entries["log.dirs"].is_read_only and entries["node.id"].is_read_only
    assert not entries["log.retention.ms"].is_read_only and not entries["keel.tail.cache.bytes"].is_read_only
    assert entries["log.retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    change = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("log.retention.ms", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change], validate_only=True)[change].result(CLIENT_TIMEOUT_S)
    assert described(broker.bootstrap, *BROKER) == {}
    admin.incremental_alter_configs([change])[change].result(CLIENT_TIMEOUT_S)
    entries = admin.describe_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert entries["log.retention.ms"].value == "1000"
    assert entries["log.retention.ms"].source == ConfigSource.DYNAMIC_BROKER_CONFIG.value
    # The legacy AlterConfigs replaces the broker's whole set.
    legacy = ConfigResource(ResourceType.BROKER, "1", set_config={"log.retention.bytes": "5000000"})
    admin.alter_configs([legacy])[legacy].result(CLIENT_TIMEOUT_S)
    assert {k: v for k, (v, _) in described(broker.bootstrap, *BROKER).items()} == {"log.retention.bytes": "5000000"}


def test_keels_budgets_and_limits_change_while_the_broker_runs(broker):
    """Keel's own budgets through the same tool: a smaller tail cache evicts
    at once, the cold-read, mover and cleaner budgets and the cleaner's
    thread count are in force (/stats), the slow-request log starts logging,
    and max.connections.per.ip turns away the next connection."""
    topic = unique("budgets")
    create_topic(broker.bootstrap, topic, 1)
    assert delivery_errors(broker.bootstrap, topic, [(b"k%d" % i, b"z" * 20_000) for i in range(10)]) == [None] * 10
    assert stats(broker)["tail_cache"]["used_bytes"] > 150_000
    kafka_configs(broker.bootstrap, "--alter", *BROKER, "--add-config",
                  "keel.tail.cache.bytes=50000,keel.cold.read.bytes.per.sec=3000000,"
                  "keel.tier.move.bytes.per.sec=7000000,keel.tier.fast.max.bytes=900000000,"
                  "log.cleaner.io.max.bytes.per.second=5000000,log.cleaner.threads=2")
    s = stats(broker)
    assert s["tail_cache"]["budget_bytes"] == 50_000 and s["tail_cache"]["used_bytes"] <= 50_000, s["tail_cache"]
    assert s["cold_reads"]["budget_bytes_per_sec"] == 3_000_000
    assert (s["tiers"]["move_bytes_per_sec"], s["tiers"]["fast_max_bytes"]) == (7_000_000, 900_000_000)
    assert (s["cleaner"]["io_bytes_per_sec"], s["cleaner"]["threads"]) == (5_000_000, 2)
    # One I/O scheduler holds every class's budget; the live path is never
    # paced, and counts the bytes appended.
    io = {c["class"]: c for c in s["io"]}
    assert {k: c["budget_bytes_per_sec"] for k, c in io.items()} == {
        "live": 0, "cold_read": 3_000_000, "tier_move": 7_000_000, "cleaning": 5_000_000}, io
    assert io["live"]["bytes"] >= 200_000, io
    wait_until(lambda: stats(broker)["cleaner"]["threads_running"] == 2, 10, "a second cleaner thread")
    kafka_configs(broker.bootstrap, "--alter", *BROKER, "--add-config", "log.cleaner.threads=1")
    # The extra thread stops after its current pass or wait (backoff 15 s).
    wait_until(lambda: stats(broker)["cleaner"]["threads_running"] == 1, 30, "the second cleaner thread to stop")

    marker = len(broker.log_path.read_text(errors="replace"))
    kafka_configs(broker.bootstrap, "--alter", *DEFAULT, "--add-config", "keel.request.slow.ms=0")
    assert delivery_errors(broker.bootstrap, topic, [(b"slow", b"s")]) == [None]
    wait_until(lambda: "keel::slow_request" in broker.log_path.read_text(errors="replace")[marker:], 10,
               "a slow-request line at keel.request.slow.ms=0")

    kafka_configs(broker.bootstrap, "--alter", *DEFAULT, "--add-config", "max.connections.per.ip=2")
    host, port = broker.bootstrap.rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=5) for _ in range(2)]
    try:
        extra = socket.create_connection((host, int(port)), timeout=5)
        extra.settimeout(5)
        assert extra.recv(1) == b"", "a third connection from 127.0.0.1 is closed"
        extra.close()
    finally:
        for s in held:
            s.close()


def test_a_broker_config_change_that_cannot_be_saved_changes_nothing(broker_factory):
    """The file is written before anything changes: when the write fails
    (ENOSPC through the storage seam) the alter answers KAFKA_STORAGE_ERROR
    and the old value stays in force; once there is room it goes in."""
    b = broker_factory({}, env={"KEEL_FAILPOINTS": "1"})
    failpoint(b, "write enospc path=__keel_meta/broker-configs")
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    res = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry("keel.tail.cache.bytes", "60000", incremental_operation=AlterConfigOpType.SET)])
    before = stats(b)["tail_cache"]["budget_bytes"]
    with pytest.raises(KafkaException) as e:
        admin.incremental_alter_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.KAFKA_STORAGE_ERROR, e.value
    assert described(b.bootstrap, *BROKER) == {}
    assert stats(b)["tail_cache"]["budget_bytes"] == before != 60_000
    clear_failpoints(b)
    admin.incremental_alter_configs([res])[res].result(CLIENT_TIMEOUT_S)
    assert stats(b)["tail_cache"]["budget_bytes"] == 60_000
    assert described(b.bootstrap, *BROKER)["keel.tail.cache.bytes"][0] == "60000"


def test_kafkas_broker_configs_keel_does_not_use_are_stored_and_described(broker):
    """Kafka accepts every broker config it defines (librdkafka's admin tests
    set sasl.kerberos.min.time.before.relogin, a per-broker one); so does
    Keel for the ones it does not use: stored, described as Kafka describes
    them (with Kafka's default as a synonym), kept across a restart, and
    documented (DescribeConfigs v3+) as not acted on. Read-only keys,
    per-broker keys at the cluster default and bad values are refused as
    Kafka 4.3.1 refuses them (checked against it)."""
    bs = broker.bootstrap
    key = "sasl.kerberos.min.time.before.relogin"
    admin = AdminClient({"bootstrap.servers": bs})
    change = ConfigResource(ResourceType.BROKER, "1", incremental_configs=[
        ConfigEntry(key, "60001", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(CLIENT_TIMEOUT_S)
    kafka_configs(bs, "--alter", *DEFAULT, "--add-config", "num.io.threads=7")

    def check():
        assert described(bs, *BROKER)[key] == (
            "60001", f"DYNAMIC_BROKER_CONFIG:{key}=60001, DEFAULT_CONFIG:{key}=60000")
        assert described(bs, *DEFAULT)["num.io.threads"] == (
            "7", "DYNAMIC_DEFAULT_BROKER_CONFIG:num.io.threads=7")
    check()
    if broker.restartable:
        broker.restart()
        check()

    for entity, config, message in [
            (DEFAULT, f"{key}=60002", "Cannot update these configs at default cluster level, broker id must "
                                      f"be specified: [{key}]"),
            (BROKER, f"{key}=abc", f"Invalid value abc for configuration {key}: Not a number of type LONG"),
            (BROKER, "queued.max.requests=9", "Cannot update these configs dynamically: [queued.max.requests]")]:
        out = refused(kafka_configs(bs, "--alter", *entity, "--add-config", config, ok=False))
        assert "InvalidRequestException" in out and message in out, out[-3000:]

    entry = config_wire.describe_configs(bs, config_wire.RESOURCE_BROKER, "1", [key])["configs"][key]
    assert (entry["value"], entry["read_only"], entry["source"]) == ("60001", False, 2), entry
    if IMPL == "keel":
        assert "Keel does not act on it" in (entry["documentation"] or ""), entry
