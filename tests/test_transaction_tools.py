"""Apache Kafka's `kafka-transactions` tool (TransactionsCommand, from the
4.3.1 jars) against Keel: list, describe, describe-producers, find-hanging
and abort, on a transaction a confluent-kafka producer holds open; and
`kafka-features describe` (FeatureCommand), which shows transaction.version."""
from __future__ import annotations

import re

from confluent_kafka import Producer

import kafka_tools
from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_transactions import _end_offsets, _read_all, _txn_producer

TOOL = "org.apache.kafka.tools.TransactionsCommand"


def transactions(bootstrap: str, *args: str, ok: bool = True):
    """Runs `kafka-transactions` and returns (exit code, rows as dicts by
    the header's column names, everything it printed)."""
    done = kafka_tools.run(TOOL, "--bootstrap-server", bootstrap, *args)
    if ok:
        assert done.returncode == 0, f"kafka-transactions {' '.join(args)}: {done.returncode}\n{done.stdout}\n{done.stderr[-3000:]}"
    lines = [line.rstrip("\t\n") for line in done.stdout.splitlines() if line.strip()]
    rows = []
    if lines:
        header = [h.strip() for h in lines[0].split("\t")]
        rows = [dict(zip(header, (v.strip() for v in line.split("\t")))) for line in lines[1:]]
    return done.returncode, rows, done.stdout + done.stderr


def test_kafka_transactions_lists_describes_and_aborts(broker):
    topic, txn_id = unique("tools"), unique("tools-tx")
    create_topic(broker.bootstrap, topic, partitions=2)
    p = _txn_producer(broker.bootstrap, txn_id)
    p.begin_transaction()
    for i in range(5):
        p.produce(topic, value=b"open%d" % i, partition=0)
    p.flush(CLIENT_TIMEOUT_S)

    _, listed, _ = transactions(broker.bootstrap, "list")
    mine = [r for r in listed if r["TransactionalId"] == txn_id]
    assert len(mine) == 1 and mine[0]["TransactionState"] == "Ongoing", listed
    producer_id = mine[0]["ProducerId"]
    # Not running for an hour yet: the duration filter leaves it out.
    _, listed, _ = transactions(broker.bootstrap, "list", "--duration-filter", "3600000")
    assert all(r["TransactionalId"] != txn_id for r in listed), listed

    _, described, _ = transactions(broker.bootstrap, "describe", "--transactional-id", txn_id)
    assert len(described) == 1, described
    assert described[0]["TransactionState"] == "Ongoing"
    assert described[0]["ProducerId"] == producer_id
    assert described[0]["TopicPartitions"] == f"{topic}-0"

    _, producers, _ = transactions(broker.bootstrap, "describe-producers", "--topic", topic, "--partition", "0")
    assert [(r["ProducerId"], r["CurrentTransactionStartOffset"]) for r in producers] == [(producer_id, "0")]

    # The coordinator knows the transaction and its partition: not hanging.
    _, hanging, _ = transactions(broker.bootstrap, "find-hanging", "--topic", topic,
                                 "--max-transaction-timeout", "0")
    assert hanging == [], hanging

    # An operator aborts it in the partition (WriteTxnMarkers): the last
    # stable offset moves past it and read_committed readers never see it.
    transactions(broker.bootstrap, "abort", "--topic", topic, "--partition", "0", "--start-offset", "0")
    _, producers, _ = transactions(broker.bootstrap, "describe-producers", "--topic", topic, "--partition", "0")
    assert [r["CurrentTransactionStartOffset"] for r in producers] == ["None"]
    wait_until(lambda: _end_offsets(broker.bootstrap, topic, "read_committed")[1] == 6, 10, "the LSO to advance")
    assert _read_all(broker.bootstrap, topic, "read_committed", partitions=2) == []

    code, _, printed = transactions(broker.bootstrap, "describe", "--transactional-id", unique("nope"), ok=False)
    assert code != 0 and "could not be found" in printed, printed

    # The producer's own end still works; what it wrote stays aborted.
    p.commit_transaction(CLIENT_TIMEOUT_S)
    _, listed, _ = transactions(broker.bootstrap, "list")
    assert [r["TransactionState"] for r in listed if r["TransactionalId"] == txn_id] == ["CompleteCommit"]
    assert _read_all(broker.bootstrap, topic, "read_committed", partitions=2) == []
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, value=b"after", partition=0)
    plain.flush(CLIENT_TIMEOUT_S)
    assert _read_all(broker.bootstrap, topic, "read_committed", partitions=2) == [b"after"]


def test_kafka_features_shows_the_transaction_version(broker_factory):
    """`kafka-features describe` (FeatureCommand, from ApiVersions): Keel
    supports transaction.version 0 to 2 and finalizes the level
    keel.transaction.version sets, which clients read to pick the
    transaction protocol."""
    for level in (2, 1):
        b = broker_factory(sets={"keel.transaction.version": str(level)})
        done = kafka_tools.run("org.apache.kafka.tools.FeatureCommand", "--bootstrap-server", b.bootstrap,
                               "describe")
        assert done.returncode == 0, done.stdout + done.stderr[-3000:]
        [line] = [line for line in done.stdout.splitlines() if "transaction.version" in line]
        fields = dict(re.findall(r"(\w+): (\S+)", line))
        assert fields["SupportedMinVersion"] == "0" and fields["SupportedMaxVersion"] == "2", line
        assert fields["FinalizedVersionLevel"] == str(level), line
        # The other features Keel reports, as Kafka 4.3.1 names them.
        features = {m.group(1): dict(re.findall(r"(\w+): (\S+)", l))
                    for l in done.stdout.splitlines() if (m := re.match(r"Feature: (\S+)", l))}
        assert features["metadata.version"]["FinalizedVersionLevel"] == "4.3-IV0", done.stdout
        assert features["group.version"]["FinalizedVersionLevel"] == "1", done.stdout
