"""Transactions with Apache Kafka's own Java client and Kafka Streams (the
4.3.1 jars bench/kafka/fetch.sh resolves), run as single-file Java
programs from tests/java/:

* TxnCopy: a transactional producer (commits and aborts), then a
  consume-transform-produce copy with sendOffsetsToTransaction, under
  transactions v2 (KIP-890: the epoch bumped at every end, partitions and
  offsets added by Produce v12+ and TxnOffsetCommit v5) and under the
  classic protocol (keel.transaction.version=1);
* StreamsCount: a Kafka Streams count with processing.guarantee=
  exactly_once_v2, killed with kill -9 while its input still arrives and
  started again: every key's count ends exactly at its number of inputs."""
from __future__ import annotations

import json
import subprocess

import pytest
import threading
import time

from confluent_kafka import Producer

import kafka_tools
from conftest import REPO, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_transactions import _end_offsets, _read_all

JAVA = REPO / "tests" / "java"


def java(program: str, *args: str) -> list[str]:
    """The command that runs one of tests/java/'s programs (the source
    launcher compiles it in memory)."""
    return ["java", "-Xmx512m", "-cp", kafka_tools.classpath(),
            f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}", str(JAVA / program), *args]


def last_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("{")]
    assert lines, f"no summary line in:\n{stdout}"
    return json.loads(lines[-1])


@pytest.mark.parametrize("transaction_version", [2, 1])
def test_java_transactional_producer_and_copy(broker_factory, transaction_version):
    broker = broker_factory(sets={"keel.transaction.version": str(transaction_version)})
    source, sink, group = unique("jin"), unique("jout"), unique("jg")
    create_topic(broker.bootstrap, source)
    create_topic(broker.bootstrap, sink, partitions=2)
    rounds = 7
    done = subprocess.run(java("TxnCopy.java", broker.bootstrap, source, sink, group, str(rounds)),
                          capture_output=True, text=True, timeout=180)
    summary = last_json(done.stdout)
    assert done.returncode == 0, f"{summary}\n{done.stderr[-4000:]}"
    assert summary["committed_inputs"] == 40 and summary["distinct_outputs"] == 40, summary
    assert summary["copy_transactions"] >= 5, summary
    # Transactions v2 bump the writer's epoch at each of its ends; the
    # classic protocol keeps the epoch InitProducerId gave.
    assert summary["writer_epoch"] == (rounds if transaction_version == 2 else 0), summary
    # A read_committed reader of another client agrees.
    assert len(_read_all(broker.bootstrap, sink, "read_committed", partitions=2)) == 40
    assert len(_read_all(broker.bootstrap, source, "read_committed")) == 40
    assert len(_read_all(broker.bootstrap, source, "read_uncommitted")) == 70


def test_kafka_streams_exactly_once_v2_counts_survive_kill9(broker, tmp_path):
    source, sink, app = unique("sin"), unique("sout"), unique("app")
    create_topic(broker.bootstrap, source, partitions=2)
    create_topic(broker.bootstrap, sink, partitions=2)
    keys, per_key = 8, 400
    cmd = java("StreamsCount.java", broker.bootstrap, source, sink, app, str(tmp_path / "state"),
               str(keys), str(per_key))

    fed = [0]

    def feed(first: int, last: int):
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(first, last):
            p.produce(source, key=b"k%d" % (i % keys), value=b"%d" % i)
            if i % 200 == 199:
                p.flush(CLIENT_TIMEOUT_S)
                fed[0] = i + 1
                time.sleep(0.25)  # input keeps arriving while the app runs
        p.flush(CLIENT_TIMEOUT_S)
        fed[0] = last

    total = keys * per_key
    feed(0, total // 4)
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    feeder = threading.Thread(target=feed, args=(total // 4, total))
    try:
        wait_until(lambda: _end_offsets(broker.bootstrap, sink, "read_uncommitted")[1] > 0, 90,
                   "the first instance's output")
        # Killed while it processes input that still arrives, mid-transaction.
        feeder.start()
        wait_until(lambda: fed[0] >= total // 2, 60, "half the input")
        first.kill()
        first.wait(30)
        assert feeder.is_alive(), "the input was all written before the kill: nothing was mid-flight"
        second = subprocess.run(cmd, capture_output=True, text=True, timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
        if feeder.is_alive():
            feeder.join(120)
    summary = last_json(second.stdout)
    assert second.returncode == 0, f"{summary}\n{second.stderr[-4000:]}"
    assert summary["reached"] and summary["keys"] == keys, summary
