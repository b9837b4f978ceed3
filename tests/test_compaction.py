"""Compacted topics against a real broker: retention leaves compact-only
topics alone, records without a key are refused, and the combinations Kafka
refuses (remote storage, DeleteRecords) are refused with Kafka's errors."""
from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import NewTopic

from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, DeliveryLog, admin, consume_range, create_topic, produce_all

from test_hardening import partition_stats


def _fill(bootstrap: str, topic: str, n: int) -> DeliveryLog:
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 10})
    log = DeliveryLog()
    produce_all(p, [{"key": b"k%d" % (i % 50), "value": b"v" * 500 + b"%d" % i, "headers": None}
                    for i in range(n)], log, topic)
    return log


def test_retention_never_deletes_a_compact_only_topic(broker_factory):
    """retention.ms and retention.bytes delete old segments of a `delete`
    topic and of a `compact,delete` one, never of a `compact` one."""
    b = broker_factory({"log.retention.check.interval.ms": "200"})
    tight = {"segment.bytes": str(16 << 10), "retention.ms": "1000", "retention.bytes": str(20 << 10)}
    topics = {policy: unique(f"ret-{policy.replace(',', '-')}") for policy in
              ("compact", "delete", "compact,delete")}
    for policy, topic in topics.items():
        create_topic(b.bootstrap, topic, 1, {**tight, "cleanup.policy": policy})
        _fill(b.bootstrap, topic, 300)
    wait_until(lambda: all(partition_stats(b, topics[p])["log_start_offset"] > 0
                           for p in ("delete", "compact,delete")),
               30, "retention to delete old segments of the delete topics")
    compact = topics["compact"]
    assert partition_stats(b, compact)["log_start_offset"] == 0
    b.restart()
    assert partition_stats(b, compact)["log_start_offset"] == 0
    consumed = consume_range(b.bootstrap, compact, [0], 300)
    assert [m.offset() for m in consumed[0]] == list(range(300))


def test_records_without_a_key_are_refused_on_compacted_topics(shared_broker):
    bs = shared_broker.bootstrap
    for policy in ("compact", "compact,delete"):
        topic = unique("nokey")
        create_topic(bs, topic, 1, {"cleanup.policy": policy})
        p = Producer({"bootstrap.servers": bs, "retries": 0, "message.timeout.ms": 10000})
        results = []
        for key in (b"k", None):
            p.produce(topic, value=b"v", key=key, partition=0,
                      on_delivery=lambda err, msg: results.append(err))
            p.flush(CLIENT_TIMEOUT_S)
        assert results[0] is None, results
        assert results[1] is not None and results[1].code() == KafkaError.INVALID_RECORD, results
    plain = unique("nokey-delete")
    create_topic(bs, plain, 1)
    p = Producer({"bootstrap.servers": bs})
    errors = []
    p.produce(plain, value=b"v", partition=0, on_delivery=lambda err, msg: errors.append(err))
    p.flush(CLIENT_TIMEOUT_S)
    assert errors == [None]


def test_remote_storage_and_delete_records_are_refused_on_compacted_topics(shared_broker):
    bs = shared_broker.bootstrap
    a = admin(bs)
    topic = unique("remote-compact")
    fut = a.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact",
                                                         "remote.storage.enable": "true"})])[topic]
    with pytest.raises(KafkaException) as refused:
        fut.result(CLIENT_TIMEOUT_S)
    err = refused.value.args[0]
    assert err.code() == KafkaError.INVALID_CONFIG, err
    assert "Remote log storage is unsupported for the compacted topics" in err.str(), err

    compact = unique("dr-compact")
    create_topic(bs, compact, 1, {"cleanup.policy": "compact"})
    _fill(bs, compact, 20)
    res = a.delete_records([TopicPartition(compact, 0, 10)])
    with pytest.raises(KafkaException) as refused:
        next(iter(res.values())).result(CLIENT_TIMEOUT_S)
    assert refused.value.args[0].code() == KafkaError.POLICY_VIOLATION, refused.value
    both = unique("dr-both")
    create_topic(bs, both, 1, {"cleanup.policy": "compact,delete"})
    _fill(bs, both, 20)
    res = a.delete_records([TopicPartition(both, 0, 10)])
    assert next(iter(res.values())).result(CLIENT_TIMEOUT_S).low_watermark == 10
