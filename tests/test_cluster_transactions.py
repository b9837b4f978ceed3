"""Transactions across a cluster's brokers: a transaction's partitions, its
coordinator and its group's coordinator are on different brokers, which
send each other requests on the inter-broker listener (the coordinator's
markers as WriteTxnMarkers to each partition's leader; a partition
leader's and a group coordinator's checks with the transaction's
coordinator as AddPartitionsToTxn v5, KIP-890).

* librdkafka (confluent-kafka), which adds partitions with
  AddPartitionsToTxn and produces below v12: its batches are checked with
  the coordinator on another broker;
* Apache Kafka's Java client under transactions v2 (Produce v12 adds the
  partitions itself, TxnOffsetCommit v5 the offsets);
* Kafka Streams exactly_once_v2 while a broker is killed with kill -9;
* an inter-broker listener secured as Kafka secures one (SASL_SSL with
  SCRAM, SSL with client certificates)."""
from __future__ import annotations

import subprocess
import threading
import time

from confluent_kafka import Consumer, Producer, TopicPartition

import pytest

from conftest import free_port, unique, wait_until
from kclient import CLIENT_TIMEOUT_S
from pki import Pki
from test_cluster import TIMEOUT_S, member, start_cluster, stats
from test_cluster_failover import coordinator_of
from test_cluster_topics import create
from test_java_transactions import java, last_json
from test_sasl import add_scram
from test_transactions import _read_all

NODES = [1, 2, 3]


def spread(brokers, topic, partitions):
    """`topic` with its partitions led by brokers 1, 2, 3, 1, ... in turn."""
    assignment = [[NODES[i % len(NODES)]] for i in range(partitions)]
    create(brokers[1], topic, num_partitions=partitions, replica_assignment=assignment)


def group_coordinated_apart(brokers, from_node, prefix):
    """A group id whose coordinator is not broker `from_node`."""
    for i in range(200):
        group = f"{prefix}-{i}"
        node = wait_until(lambda: coordinator_of(brokers[1], group), TIMEOUT_S, "a group's coordinator")
        if node != from_node:
            return group, node
    raise AssertionError("every group is coordinated by one broker")


def transactions(p, topic, commits, per_round, prefix, pause_s=0.0) -> list[bytes]:
    """One transaction of `per_round` records over partitions 0..2 per entry
    of `commits`, committed or aborted as it says: -> the committed values."""
    committed = []
    for round_, commit in enumerate(commits):
        p.begin_transaction()
        values = [prefix + b"%d-%d" % (round_, i) for i in range(per_round)]
        for i, v in enumerate(values):
            p.produce(topic, value=v, partition=i % 3)
        if commit:
            p.commit_transaction(CLIENT_TIMEOUT_S)
            committed += values
        else:
            assert p.flush(CLIENT_TIMEOUT_S) == 0
            p.abort_transaction(CLIENT_TIMEOUT_S)
        time.sleep(pause_s)
    return committed


def sent_markers(b) -> int:
    return stats(b)["peer_requests"].get("WriteTxnMarkers", {}).get("requests", 0)


def test_a_librdkafka_transaction_spans_every_broker(etcd, tmp_path):
    """A transactional producer writes each transaction to partitions all
    three brokers lead, and sends its consumer's offsets to a group
    another broker coordinates: committed transactions are read once,
    aborted ones never, and the group's offsets are the last committed
    transaction's."""
    brokers = start_cluster(etcd, tmp_path, NODES)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    source, sink = unique("xsrc"), unique("xsink")
    tid = unique("spanning")
    spread(brokers, source, 3)
    spread(brokers, sink, 3)
    coordinator = wait_until(lambda: coordinator_of(brokers[1], tid, 1), TIMEOUT_S,
                             "the transactional id's coordinator")
    group, group_node = group_coordinated_apart(brokers, coordinator, "spanning-group")
    print(f"transaction coordinator {coordinator}, group coordinator {group_node}", flush=True)

    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(60):
        plain.produce(source, value=b"in-%d" % i, partition=i % 3)
    assert plain.flush(CLIENT_TIMEOUT_S) == 0

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(CLIENT_TIMEOUT_S)
    # Transactions written straight to the sink, every other one aborted.
    committed = transactions(p, sink, [True, False] * 3, 9, b"t")

    # A copy of the source, each batch of input with its offsets.
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                  "auto.offset.reset": "earliest", "isolation.level": "read_committed"})
    c.subscribe([source])
    copied, deadline = 0, time.monotonic() + 90
    try:
        while copied < 60:
            assert time.monotonic() < deadline, f"copied only {copied}"
            batch = [m for m in c.consume(20, 0.5) if m.error() is None]
            if not batch:
                continue
            p.begin_transaction()
            for m in batch:
                p.produce(sink, value=b"copy-" + m.value(), partition=m.partition())
            p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(),
                                          CLIENT_TIMEOUT_S)
            p.commit_transaction(CLIENT_TIMEOUT_S)
            committed += [b"copy-" + m.value() for m in batch]
            copied += len(batch)
    finally:
        c.close()

    assert sorted(_read_all(bootstrap, sink, "read_committed", partitions=3)) == sorted(committed)
    assert len(_read_all(bootstrap, sink, "read_uncommitted", partitions=3)) == len(committed) + 27
    check = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        offsets = check.committed([TopicPartition(source, i) for i in range(3)], timeout=CLIENT_TIMEOUT_S)
    finally:
        check.close()
    assert {tp.partition: tp.offset for tp in offsets} == {0: 20, 1: 20, 2: 20}
    # The coordinator sent the markers of partitions it does not lead.
    assert sent_markers(brokers[coordinator]) > 0


def test_java_transactions_v2_across_brokers(etcd, tmp_path):
    """Apache Kafka's Java client under transactions v2 (TxnCopy: commits
    and aborts, then a consume-transform-produce copy with
    sendOffsetsToTransaction), its partitions on every broker."""
    brokers = start_cluster(etcd, tmp_path, NODES)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    source, sink, group = unique("jxin"), unique("jxout"), unique("jxg")
    # TxnCopy reads its input's partition 0; its output is spread.
    spread(brokers, source, 1)
    spread(brokers, sink, 3)
    done = subprocess.run(java("TxnCopy.java", bootstrap, source, sink, group, "7"),
                          capture_output=True, text=True, timeout=240)
    summary = last_json(done.stdout)
    assert done.returncode == 0, f"{summary}\n{done.stderr[-4000:]}"
    assert summary["committed_inputs"] == 40 and summary["distinct_outputs"] == 40, summary
    assert summary["writer_epoch"] == 7, summary
    assert len(_read_all(bootstrap, sink, "read_committed", partitions=3)) == 40
    assert sum(sent_markers(b) for b in brokers.values()) > 0


def test_kafka_streams_exactly_once_v2_across_a_broker_kill(etcd, tmp_path):
    """Kafka Streams counts with exactly_once_v2 over topics spread across
    three brokers, one of which is killed with kill -9 while input still
    arrives: the application runs on against the other two, and every
    key's count ends exactly at its number of inputs."""
    brokers = start_cluster(etcd, tmp_path, NODES)
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    source, sink, app = unique("xsin"), unique("xsout"), unique("xapp")
    keys, per_key = 8, 300
    total = keys * per_key
    fed = [0]
    feeder_errors: list = []

    def feed(first: int, last: int):
        p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True,
                      "message.timeout.ms": 120000})
        for i in range(first, last):
            p.produce(source, key=b"k%d" % (i % keys), value=b"%d" % i,
                      on_delivery=lambda e, m: e and feeder_errors.append(e))
            if i % 200 == 199:
                p.flush(CLIENT_TIMEOUT_S)
                fed[0] = i + 1
                time.sleep(0.25)
        p.flush(120)
        fed[0] = last

    app_run = None
    feeder = threading.Thread(target=feed, args=(total // 4, total))
    try:
        spread(brokers, source, 2)
        spread(brokers, sink, 2)
        feed(0, total // 4)
        cmd = java("StreamsCount.java", bootstrap, source, sink, app, str(tmp_path / "state"),
                   str(keys), str(per_key))
        app_run = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_until(lambda: sum(len(stats(b)["txn_log"]["partitions"]) for b in brokers.values()) > 0
                   and _committed_any(bootstrap, sink), 120, "the application's first output")
        feeder.start()
        wait_until(lambda: fed[0] >= total // 2, 60, "half the input")
        # Broker 3 leads no partition of the input or output (they are on 1
        # and 2): it holds coordinators and the application's internal
        # topics' partitions. Broker 2 leads half the input and output.
        victim = 2
        brokers[victim].kill9()
        print(f"broker {victim} killed at input {fed[0]} of {total}", flush=True)
        out, err = app_run.communicate(timeout=300)
    finally:
        if app_run is not None and app_run.poll() is None:
            app_run.kill()
        if feeder.is_alive():
            feeder.join(150)
        for b in brokers.values():
            b.close()
    summary = last_json(out)
    assert app_run.returncode == 0, f"{summary}\n{err[-6000:]}"
    assert summary["reached"] and summary["keys"] == keys, summary
    assert not feeder_errors, feeder_errors[:3]


def _committed_any(bootstrap: str, topic: str) -> bool:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "isolation.level": "read_committed"})
    try:
        return any(c.get_watermark_offsets(TopicPartition(topic, p), timeout=5, cached=False)[1] > 0
                   for p in range(2))
    except Exception:  # noqa: BLE001 (not there yet)
        return False
    finally:
        c.close()


SCRAM_JAAS = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
              'username="broker" password="broker-secret";')


def secured_listeners(pki: Pki, protocol: str) -> dict[str, str]:
    """The settings of an INTERNAL inter-broker listener of `protocol`, as
    a Kafka operator writes them: SASL_SSL with SCRAM-SHA-512 (the broker's
    user is a SCRAM user like any other), or SSL requiring client
    certificates (each broker's certificate, from one CA)."""
    sets = {
        "inter.broker.listener.name": "INTERNAL",
        "listener.security.protocol.map": f"PLAINTEXT:PLAINTEXT,INTERNAL:{protocol}",
        "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.dir / "broker.pem"),
        "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca,
    }
    if protocol == "SASL_SSL":
        sets.update({
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.internal.sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "listener.name.internal.scram-sha-512.sasl.jaas.config": SCRAM_JAAS,
            # Sessions end: connections to other brokers are replaced.
            "listener.name.internal.connections.max.reauth.ms": "1500",
        })
    else:
        sets["listener.name.internal.ssl.client.auth"] = "required"
    return sets


def with_internal_listener(b, sets: dict[str, str]) -> None:
    """Clients on PLAINTEXT at `b.bootstrap`, brokers on INTERNAL."""
    internal = free_port()
    while internal == b.port:
        internal = free_port()
    b.sets.update(sets)
    b.sets["listeners"] = f"PLAINTEXT://{b.bootstrap},INTERNAL://127.0.0.1:{internal}"
    b.sets["advertised.listeners"] = b.sets["listeners"]


@pytest.mark.parametrize("protocol", ["SASL_SSL", "SSL"])
def test_a_transaction_spans_brokers_over_a_secured_inter_broker_listener(etcd, tmp_path, protocol):
    """The brokers reach each other only on an INTERNAL listener that is
    SASL_SSL (SCRAM-SHA-512) or SSL with client certificates required: the
    leaders' checks with the coordinator and the coordinator's markers go
    through it, and a transaction over partitions every broker leads ends
    as it should. A broker whose inter-broker listener lacks its
    credentials does not start, and says which key to set."""
    pki = Pki(tmp_path)
    pki.leaf("broker", server=True, client_too=True)
    sets = secured_listeners(pki, protocol)
    brokers = {}
    for node in NODES:
        brokers[node] = member(etcd, tmp_path, node)
        with_internal_listener(brokers[node], sets)
        brokers[node].start()
    for b in brokers.values():
        wait_until(lambda: not stats(b)["fenced"], TIMEOUT_S, f"{b.log_name} to register")
    bootstrap = ",".join(b.bootstrap for b in brokers.values())
    if protocol == "SASL_SSL":
        # Kept in etcd: every broker authenticates the others with it.
        add_scram(brokers[1].bootstrap, "broker", "broker-secret")
    sink, tid = unique("secsink"), unique("secured")
    spread(brokers, sink, 3)
    coordinator = wait_until(lambda: coordinator_of(brokers[1], tid, 1), TIMEOUT_S,
                             "the transactional id's coordinator")

    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(CLIENT_TIMEOUT_S)
    # Two seconds apart: past a SASL session's lifetime.
    committed = transactions(p, sink, [True, False, True], 6, b"s", pause_s=2)
    assert sorted(_read_all(bootstrap, sink, "read_committed", partitions=3)) == sorted(committed)
    assert sent_markers(brokers[coordinator]) > 0
    # The other leaders asked the coordinator about their batches.
    asked = sum(stats(b)["peer_requests"].get("AddPartitionsToTxn", {}).get("requests", 0)
                for n, b in brokers.items() if n != coordinator)
    assert asked > 0
    print({b.log_name: stats(b)["peer_requests"] for b in brokers.values()}, flush=True)

    # Without the broker's own credentials (or the truststore it checks the
    # others with), a cluster's broker refuses to start.
    lone = member(etcd, tmp_path, 9)
    with_internal_listener(lone, sets)
    if protocol == "SASL_SSL":
        missing = "listener.name.internal.scram-sha-512.sasl.jaas.config"
        del lone.sets[missing]
    else:
        # The listener itself no longer needs a truststore; its clients do.
        missing = "ssl.truststore.location"
        del lone.sets[missing], lone.sets["listener.name.internal.ssl.client.auth"]
    lone.data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(lone.command(), capture_output=True, text=True, timeout=60)
    said = done.stdout + done.stderr
    assert done.returncode != 0 and missing in said and "INTERNAL" in said, said[-2000:]
