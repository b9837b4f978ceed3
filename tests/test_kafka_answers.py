"""Answers where Keel follows Apache Kafka 4.x to the letter: CreateTopics'
refusals and its validate_only topic id, OffsetCommit v9 to a group that
does not exist, DescribeCluster's endpoint type, the authorized-operations
masks (only the resource's own operations), and a failed acks=0 Produce
closing the connection. On the wire, and through confluent-kafka's
AdminClient where it exposes the field."""
from __future__ import annotations

import uuid

from confluent_kafka import ConsumerGroupTopicPartitions, TopicCollection, TopicPartition
from confluent_kafka.admin import AclOperation, AdminClient

import kafka_wire as w
from conftest import unique
from kclient import CLIENT_TIMEOUT_S, create_topic

CREATE_TOPICS, OFFSET_COMMIT, DESCRIBE_CLUSTER = 19, 8, 60
NONE, GROUP_ID_NOT_FOUND, INVALID_CONFIG, INVALID_REQUEST = 0, 69, 40, 42
UNSUPPORTED_ENDPOINT_TYPE, TOPIC_ALREADY_EXISTS = 115, 36


def create_topics_v7(bootstrap: str, topics: list[tuple[str, dict[str, str | None]]],
                     validate_only: bool) -> list[dict]:
    """CreateTopics v7 -> per result: name, topic id, error, partitions."""
    body = w.uvarint(len(topics) + 1)
    for name, configs in topics:
        body += w.compact_string(name) + w.i32(1) + w.i16(-1) + w.uvarint(1)
        body += w.uvarint(len(configs) + 1)
        body += b"".join(w.compact_string(k) + w.compact_string(v) + w.EMPTY_TAGS for k, v in configs.items())
        body += w.EMPTY_TAGS
    body += w.i32(30000) + w.i8(1 if validate_only else 0) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(CREATE_TOPICS, 7, 3) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    out = []
    for _ in range(r.uvarint() - 1):
        name = r.take(r.uvarint() - 1).decode()
        topic_id = uuid.UUID(bytes=r.take(16))
        error = r.i16()
        n = r.uvarint()
        message = r.take(n - 1).decode() if n else None
        partitions, _rf = r.i32(), r.i16()
        n = r.uvarint()
        for _ in range(max(n - 1, 0)):
            r.take(r.uvarint() - 1)
            n2 = r.uvarint()
            r.take(max(n2 - 1, 0))
            r.i8(), r.i8(), r.i8()
            r.skip_tags()
        r.skip_tags()
        out.append({"name": name, "id": topic_id, "error": error, "message": message, "partitions": partitions})
    r.skip_tags()
    assert r.done()
    return out


def test_create_topics_refusals_and_validate_only_follow_kafka(broker):
    ok, dup, nulls = unique("ct-ok"), unique("ct-dup"), unique("ct-null")
    results = create_topics_v7(broker.bootstrap, [(ok, {}), (dup, {}), (dup, {}),
                                                   (nulls, {"retention.ms": None, "segment.ms": "600000"})],
                               validate_only=True)
    by_name = {r["name"]: r for r in results}
    assert [r["name"] for r in results] == [ok, dup, nulls], results
    # validate_only: checked, not created, and no topic id.
    assert by_name[ok]["error"] == NONE and by_name[ok]["id"] == uuid.UUID(int=0), by_name[ok]
    assert by_name[ok]["partitions"] == 1
    # A name given twice is refused once.
    assert by_name[dup]["error"] == INVALID_REQUEST, by_name[dup]
    assert by_name[nulls]["error"] == INVALID_CONFIG and "retention.ms" in by_name[nulls]["message"]
    # Nothing was created: creating for real now works, with an id.
    [created] = create_topics_v7(broker.bootstrap, [(ok, {})], validate_only=False)
    assert created["error"] == NONE and created["id"] != uuid.UUID(int=0), created
    [again] = create_topics_v7(broker.bootstrap, [(ok, {})], validate_only=True)
    assert again["error"] == TOPIC_ALREADY_EXISTS


def offset_commit_v9(bootstrap: str, group: str, generation: int, topic: str) -> int:
    """OffsetCommit v9 of offset 1 of partition 0 -> the partition's error."""
    part = w.i32(0) + w.i64(1) + w.i32(-1) + w.compact_string("") + w.EMPTY_TAGS
    topics = w.uvarint(2) + w.compact_string(topic) + w.uvarint(2) + part + w.EMPTY_TAGS
    member = "" if generation < 0 else "member-1"
    body = w.compact_string(group) + w.i32(generation) + w.compact_string(member) + w.compact_string(None)
    body += topics + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(OFFSET_COMMIT, 9, 4) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    assert r.uvarint() == 2
    r.take(r.uvarint() - 1)
    assert r.uvarint() == 2
    r.i32()
    return r.i16()


def test_offset_commit_v9_to_a_group_that_does_not_exist(broker):
    """With a generation: GROUP_ID_NOT_FOUND (KIP-848); without one (-1, a
    simple consumer's commit): the group is made and the offset kept."""
    topic, group = unique("oc9"), unique("oc9-group")
    create_topic(broker.bootstrap, topic, 1)
    assert offset_commit_v9(broker.bootstrap, group, 5, topic) == GROUP_ID_NOT_FOUND
    assert offset_commit_v9(broker.bootstrap, group, -1, topic) == NONE
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    req = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0)])
    got = admin.list_consumer_group_offsets([req])[group].result(CLIENT_TIMEOUT_S)
    assert [tp.offset for tp in got.topic_partitions] == [1]


def describe_cluster_v1(bootstrap: str, endpoint_type: int) -> tuple[int, int]:
    """DescribeCluster v1 -> (error, cluster authorized operations)."""
    body = w.i8(1) + w.i8(endpoint_type) + w.EMPTY_TAGS
    with w.Conn(bootstrap) as c:
        c.send(w.frame(w.header_v2(DESCRIBE_CLUSTER, 1, 5) + body))
        _cid, resp = c.recv_response_flexible()
    r = w.Reader(resp)
    r.i32()
    error = r.i16()
    n = r.uvarint()
    r.take(max(n - 1, 0))
    assert r.i8() == endpoint_type
    r.take(r.uvarint() - 1)  # cluster id
    r.i32()  # controller
    for _ in range(r.uvarint() - 1):
        r.i32()
        r.take(r.uvarint() - 1)
        r.i32()
        n = r.uvarint()
        r.take(max(n - 1, 0))
        r.skip_tags()
    ops = r.i32()
    r.skip_tags()
    assert r.done()
    return error, ops


def test_describe_cluster_answers_for_brokers_only_with_the_clusters_operations(broker):
    error, ops = describe_cluster_v1(broker.bootstrap, 1)
    assert error == NONE
    # CREATE, ALTER, DESCRIBE, CLUSTER_ACTION, DESCRIBE_CONFIGS,
    # ALTER_CONFIGS, IDEMPOTENT_WRITE: nothing of a topic's READ or WRITE.
    assert ops == sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12)), bin(ops)
    assert describe_cluster_v1(broker.bootstrap, 2)[0] == UNSUPPORTED_ENDPOINT_TYPE


def test_authorized_operations_are_the_resources_own(broker):
    """confluent-kafka's describe_cluster and describe_consumer_groups with
    include_authorized_operations (no authorizer: every operation the
    resource type supports, as Kafka answers)."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    cluster = admin.describe_cluster(include_authorized_operations=True).result(CLIENT_TIMEOUT_S)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    topic, group = unique("ops"), unique("ops-group")
    create_topic(broker.bootstrap, topic, 1)
    assert offset_commit_v9(broker.bootstrap, group, -1, topic) == NONE
    described = admin.describe_consumer_groups([group], include_authorized_operations=True)[group] \
        .result(CLIENT_TIMEOUT_S)
    assert set(described.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE,
                                                     AclOperation.DELETE}
    topics = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)
    got = topics[topic].result(CLIENT_TIMEOUT_S)
    assert set(got.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
        AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}


def test_a_failed_acks_zero_produce_closes_the_connection(broker):
    """acks=0 gets no response, so an error would go unseen: Kafka closes
    the connection, and so does Keel; a successful one keeps it open."""
    topic = unique("acks0")
    create_topic(broker.bootstrap, topic, 1)
    batch = w.record_batch([(None, b"v")])

    def produce_acks0(partition: int) -> bytes:
        body = w.string(None) + w.i16(0) + w.i32(30000) + w.i32(1) + w.string(topic) + w.i32(1)
        body += w.i32(partition) + w.nbytes(batch)
        return w.frame(w.header_v1(w.PRODUCE, 3, 6) + body)

    with w.Conn(broker.bootstrap, timeout_s=5) as c:
        c.send(produce_acks0(0))
        c.send(w.api_versions_request(0, 7))
        cid, _ = c.recv_response()
        assert cid == 7, "the connection stays open after a good acks=0 produce"
        c.send(produce_acks0(9))  # no such partition
        assert c.closed_by_peer()
