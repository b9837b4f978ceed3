#!/usr/bin/env python3
"""Runs every Apache Kafka 4.3.1 command-line tool that talks to a broker
against a running Keel and prints a Markdown table: each invocation, whether
it worked, and the first error line when it did not. The table of Kafka's
tools in docs/compatibility.md is made from its output.

It prepares a topic with records and a consumer group with committed
offsets (confluent-kafka), then runs each tool's main class from the jars
`bench/kafka/fetch.sh` resolves, as the `kafka-*.sh` scripts would.
"Works" means the tool exited 0 and printed what its invocation asks for
(see CHECKS); the table says nothing about options not listed.

Usage (from the repository root, Keel on 127.0.0.1:9092):

    target/debug/keel serve --data-dir /tmp/keel-survey &
    python3 tests/tools/kafka_cli_survey.py [--bootstrap 127.0.0.1:9092]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[2]
LIBS = REPO / "bench" / "lab" / "kafka-libs"
LOG4J = REPO / "bench" / "kafka" / "tools-log4j2.properties"


def run(main: str, *args: str, stdin: str | None = None, timeout_s: float = 60) -> subprocess.CompletedProcess:
    cmd = ["java", "-Xmx256m", "-cp", f"{LIBS}/*", f"-Dlog4j2.configurationFile={LOG4J}", main, *args]
    try:
        return subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout_s:.0f} s")


def first_error(done: subprocess.CompletedProcess) -> str:
    """The most telling line: an exception with its message, else any error."""
    lines = [line.strip() for line in ((done.stderr or "") + "\n" + (done.stdout or "")).splitlines()]
    for words in (("Exception:",), ("Error", "error", "not supported", "timed out", "Missing required")):
        for line in lines:
            if any(w in line for w in words):
                return line[line.find("org.apache") if "org.apache" in line else 0:][:160]
    lines = [l for l in text.splitlines() if l.strip()]
    return (lines[-1] if lines else f"exit {done.returncode}")[:160]


def prepare(bootstrap: str, topic: str, group: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.create_topics([NewTopic(topic, 2, 1)]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(100):
        p.produce(topic, key=b"k%d" % i, value=b"v%d" % i, partition=i % 2)
    p.flush(30)
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  "enable.auto.commit": False})
    c.subscribe([topic])
    got, deadline = 0, time.monotonic() + 30
    while got < 100 and time.monotonic() < deadline:
        m = c.poll(1)
        if m is not None and not m.error():
            got += 1
    c.commit(asynchronous=False)
    c.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bootstrap", default="127.0.0.1:9092")
    args = ap.parse_args()
    b = args.bootstrap
    suffix = uuid.uuid4().hex[:8]
    topic, group, scratch = f"survey-{suffix}", f"survey-group-{suffix}", f"survey-scratch-{suffix}"
    prepare(b, topic, group)
    tmp = Path(tempfile.mkdtemp(prefix="kafka-cli-survey-"))
    client_config = tmp / "client.properties"
    client_config.write_text("")
    offsets = tmp / "delete-records.json"
    offsets.write_text(json.dumps({"partitions": [{"topic": topic, "partition": 0, "offset": 10}], "version": 1}))
    bs = ["--bootstrap-server", b]
    T = "org.apache.kafka.tools."
    # (tool, invocation shown, main class, arguments, stdin, check of stdout)
    checks = [
        ("kafka-topics", "--list", T + "TopicCommand", [*bs, "--list"], None, lambda o: topic in o),
        ("kafka-topics", "--describe --topic", T + "TopicCommand", [*bs, "--describe", "--topic", topic], None,
         lambda o: "Partition: 1" in o),
        ("kafka-topics", "--create", T + "TopicCommand", [*bs, "--create", "--topic", scratch, "--partitions", "1"],
         None, lambda o: "Created topic" in o),
        ("kafka-topics", "--alter --partitions", T + "TopicCommand",
         [*bs, "--alter", "--topic", scratch, "--partitions", "3"], None, lambda o: True),
        ("kafka-topics", "--delete", T + "TopicCommand", [*bs, "--delete", "--topic", scratch], None, lambda o: True),
        ("kafka-console-producer", "(lines on stdin)", T + "ConsoleProducer", [*bs, "--topic", topic],
         "a\nb\nc\n", lambda o: True),
        ("kafka-console-consumer", "--from-beginning --max-messages", T + "consumer.ConsoleConsumer",
         [*bs, "--topic", topic, "--from-beginning", "--max-messages", "5", "--timeout-ms", "20000"], None,
         lambda o: len(o.splitlines()) >= 5),
        ("kafka-consumer-groups", "--list", T + "consumer.group.ConsumerGroupCommand", [*bs, "--list"], None,
         lambda o: group in o),
        ("kafka-consumer-groups", "--describe --group", T + "consumer.group.ConsumerGroupCommand",
         [*bs, "--describe", "--group", group], None, lambda o: topic in o),
        ("kafka-consumer-groups", "--reset-offsets --to-earliest --execute", T + "consumer.group.ConsumerGroupCommand",
         [*bs, "--reset-offsets", "--group", group, "--topic", topic, "--to-earliest", "--execute"], None,
         lambda o: topic in o),
        ("kafka-consumer-groups", "--delete-offsets", T + "consumer.group.ConsumerGroupCommand",
         [*bs, "--delete-offsets", "--group", group, "--topic", topic], None, lambda o: topic in o),
        ("kafka-consumer-groups", "--delete --group", T + "consumer.group.ConsumerGroupCommand",
         [*bs, "--delete", "--group", group], None, lambda o: "successful" in o),
        ("kafka-groups", "--list", T + "GroupsCommand", [*bs, "--list"], None, lambda o: True),
        ("kafka-get-offsets", "--topic", T + "GetOffsetShell", [*bs, "--topic", topic], None,
         lambda o: f"{topic}:0:" in o),
        ("kafka-delete-records", "--offset-json-file", T + "DeleteRecordsCommand",
         [*bs, "--offset-json-file", str(offsets)], None, lambda o: "low_watermark: 10" in o),
        ("kafka-configs", "--describe --entity-type topics", "kafka.admin.ConfigCommand",
         [*bs, "--describe", "--entity-type", "topics", "--entity-name", topic], None, lambda o: topic in o),
        ("kafka-configs", "--alter --entity-type topics --add-config", "kafka.admin.ConfigCommand",
         [*bs, "--alter", "--entity-type", "topics", "--entity-name", topic, "--add-config", "retention.ms=86400000"],
         None, lambda o: "Completed" in o),
        ("kafka-configs", "--describe --entity-type brokers", "kafka.admin.ConfigCommand",
         [*bs, "--describe", "--entity-type", "brokers", "--entity-name", "1"], None, lambda o: True),
        ("kafka-configs", "--alter --entity-type brokers --add-config", "kafka.admin.ConfigCommand",
         [*bs, "--alter", "--entity-type", "brokers", "--entity-name", "1", "--add-config", "log.retention.ms=1000"],
         None, lambda o: "Completed" in o),
        ("kafka-configs", "--describe --entity-type broker-loggers", "kafka.admin.ConfigCommand",
         [*bs, "--describe", "--entity-type", "broker-loggers", "--entity-name", "1"], None, lambda o: True),
        ("kafka-configs", "--alter --entity-type users --entity-default (quotas)", "kafka.admin.ConfigCommand",
         [*bs, "--alter", "--entity-type", "users", "--entity-default", "--add-config", "producer_byte_rate=1048576"],
         None, lambda o: "Completed" in o),
        ("kafka-configs", "--alter --entity-type ips (quotas)", "kafka.admin.ConfigCommand",
         [*bs, "--alter", "--entity-type", "ips", "--entity-name", "10.0.0.1", "--add-config",
          "connection_creation_rate=100"], None, lambda o: "Completed" in o),
        ("kafka-configs", "--describe --entity-type clients (quotas)", "kafka.admin.ConfigCommand",
         [*bs, "--describe", "--entity-type", "clients"], None, lambda o: True),
        ("kafka-configs", "--describe --entity-type users (quotas)", "kafka.admin.ConfigCommand",
         [*bs, "--describe", "--entity-type", "users"], None, lambda o: "producer_byte_rate=1048576" in o),
        ("kafka-log-dirs", "--describe", T + "LogDirsCommand", [*bs, "--describe"], None, lambda o: '"logDirs"' in o),
        ("kafka-features", "describe", T + "FeatureCommand", [*bs, "describe"], None,
         lambda o: "transaction.version" in o),
        ("kafka-leader-election", "--election-type preferred --all-topic-partitions", T + "LeaderElectionCommand",
         [*bs, "--election-type", "preferred", "--all-topic-partitions"], None, lambda o: True),
        ("kafka-transactions", "list", T + "TransactionsCommand", [*bs, "list"], None, lambda o: "TransactionalId" in o),
        ("kafka-broker-api-versions", "", T + "BrokerApiVersionsCommand", bs, None, lambda o: "Produce(0)" in o),
        ("kafka-cluster", "cluster-id", T + "ClusterTool", ["cluster-id", *bs], None, lambda o: "Cluster ID" in o),
        ("kafka-metadata-quorum", "describe --status", T + "MetadataQuorumCommand", [*bs, "describe", "--status"],
         None, lambda o: "LeaderId" in o),
        ("kafka-producer-perf-test", "--num-records 1000", T + "ProducerPerformance",
         ["--topic", topic, "--num-records", "1000", "--record-size", "100", "--throughput", "-1",
          "--producer-props", f"bootstrap.servers={b}"], None, lambda o: "records sent" in o),
        ("kafka-consumer-perf-test", "--messages 100", T + "ConsumerPerformance",
         [*bs, "--topic", topic, "--messages", "100"], None, lambda o: "start.time" in o or "data.consumed" in o),
        ("kafka-e2e-latency", "100 records", T + "EndToEndLatency", [b, topic, "100", "all", "100"], None,
         lambda o: "Avg latency" in o),
        ("kafka-verifiable-producer", "--max-messages 10", T + "VerifiableProducer",
         [*bs, "--topic", topic, "--max-messages", "10"], None, lambda o: '"shutdown_complete"' in o),
        ("kafka-verifiable-consumer", "--max-messages 10", T + "VerifiableConsumer",
         [*bs, "--topic", topic, "--group-id", f"verifiable-{suffix}", "--max-messages", "10"], None,
         lambda o: '"records_consumed"' in o),
        ("kafka-streams-application-reset", "--input-topics --dry-run", T + "StreamsResetter",
         [*bs, "--application-id", f"app-{suffix}", "--input-topics", topic, "--dry-run"], None, lambda o: True),
        ("kafka-acls", "--list", T + "AclCommand", [*bs, "--list"], None, lambda o: True),
        ("kafka-reassign-partitions", "--list", T + "reassign.ReassignPartitionsCommand", [*bs, "--list"], None,
         lambda o: True),
        ("kafka-client-metrics", "--list", T + "ClientMetricsCommand", [*bs, "--list"], None, lambda o: True),
        ("kafka-delegation-tokens", "--describe", T + "DelegationTokenCommand",
         [*bs, "--describe", "--command-config", str(client_config)], None, lambda o: True),
        ("kafka-share-groups", "--list", T + "consumer.group.ShareGroupCommand", [*bs, "--list"], None,
         lambda o: True),
        ("kafka-streams-groups", "--list", T + "streams.StreamsGroupCommand", [*bs, "--list"], None, lambda o: True),
    ]
    print("| tool | invocation | works | first error |")
    print("| --- | --- | --- | --- |")
    for tool, shown, main_class, argv, stdin, check in checks:
        done = run(main_class, *argv, stdin=stdin)
        ok = done.returncode == 0 and check(done.stdout)
        error = "" if ok else first_error(done).replace("|", "\\|")
        print(f"| `{tool}` | `{shown}` | {'yes' if ok else 'no'} | {error} |", flush=True)
    sys.exit(0)


if __name__ == "__main__":
    main()
