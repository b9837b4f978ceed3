#!/usr/bin/env python3
"""Captures the request frames real Kafka clients send, as decode fixtures
for keel-protocol (crates/keel-protocol/tests/client_frames.rs).

Starts a keel broker that advertises a small TCP proxy on 127.0.0.1, runs
produce / consume / admin scenarios with confluent-kafka, kafka-python and
kcat through the proxy, and writes the first request of every (api key,
version) each client sent, one file per frame (without the 4-byte size
prefix):

    <client>-<version>__<api key>-<api name>-v<api version>__cid<correlation id>.bin

Usage (from the repository root, after `cargo build`):

    python3 tests/tools/capture_frames.py [--out DIR] [--clients confluent,kafka-python,kcat]

Files of the captured clients are replaced; other files in DIR are kept.
"""
from __future__ import annotations

import argparse
import gc
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TESTS))

from conftest import Broker, free_port, unique, wait_until  # noqa: E402

DEFAULT_OUT = TESTS.parent / "crates" / "keel-protocol" / "tests" / "fixtures" / "frames"

API_NAMES = {
    0: "produce", 1: "fetch", 2: "list_offsets", 3: "metadata", 8: "offset_commit",
    9: "offset_fetch", 10: "find_coordinator", 11: "join_group", 12: "heartbeat",
    13: "leave_group", 14: "sync_group", 15: "describe_groups", 16: "list_groups",
    18: "api_versions", 19: "create_topics", 20: "delete_topics", 21: "delete_records",
    22: "init_producer_id", 23: "offset_for_leader_epoch", 32: "describe_configs",
    33: "alter_configs", 37: "create_partitions", 60: "describe_cluster",
    75: "describe_topic_partitions",
}


class Recorder:
    """Frames per client label, first of each (api key, version) only. A
    connection belongs to the client whose scenario was running when it was
    opened, so a client's late background requests are still its own."""

    def __init__(self):
        self.lock = threading.Lock()
        self.label = "unlabelled"
        self.frames: dict[str, dict[tuple[int, int], bytes]] = {}

    def current_label(self) -> str:
        with self.lock:
            return self.label

    def record(self, label: str, frame: bytes) -> None:
        if len(frame) < 8:
            return
        key = (int.from_bytes(frame[0:2], "big", signed=True),
               int.from_bytes(frame[2:4], "big", signed=True))
        with self.lock:
            self.frames.setdefault(label, {}).setdefault(key, frame)


class Proxy:
    """Forwards 127.0.0.1:port to the broker, recording client->broker frames."""

    def __init__(self, port: int, upstream_port: int, recorder: Recorder):
        self.upstream_port = upstream_port
        self.recorder = recorder
        self.listener = socket.create_server(("127.0.0.1", port))
        self.listener.settimeout(0.2)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except socket.timeout:
                continue
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            label = self.recorder.current_label()
            threading.Thread(target=self._requests, args=(label, client, upstream),
                             daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client), daemon=True).start()

    def _requests(self, label: str, src: socket.socket, dst: socket.socket) -> None:
        buf = b""
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
                buf += chunk
                while len(buf) >= 4:
                    size = int.from_bytes(buf[:4], "big", signed=True)
                    if len(buf) < 4 + size:
                        break
                    self.recorder.record(label, buf[4:4 + size])
                    buf = buf[4 + size:]
        except OSError:
            pass
        finally:
            _close(src, dst)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            _close(src, dst)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.listener.close()


def _close(*socks: socket.socket) -> None:
    for s in socks:
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()


class ProxiedBroker(Broker):
    """A keel broker that tells clients to connect to the proxy."""

    def __init__(self, data_dir: Path, log_path: Path, advertised_port: int):
        super().__init__(data_dir, log_path)
        self.advertised = f"127.0.0.1:{advertised_port}"

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--advertised") + 1] = self.advertised
        return cmd


# ---------------------------------------------------------------- clients

def confluent_label() -> str:
    import confluent_kafka
    return f"confluent-kafka-{confluent_kafka.__version__}-librdkafka-{confluent_kafka.libversion()[0]}"


def confluent(bs: str) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import (AdminClient, ConfigResource, NewPartitions, NewTopic,
                                       OffsetSpec)
    a = AdminClient({"bootstrap.servers": bs})
    topic, doomed = unique("cap-ck"), unique("cap-ck-del")
    fs = a.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000"}),
                          NewTopic(doomed, 1, 1)])
    for f in fs.values():
        f.result(15)
    res = ConfigResource(ConfigResource.Type.TOPIC, topic)
    a.describe_configs([res])[res].result(15)
    a.create_partitions([NewPartitions(topic, 3)])[topic].result(15)
    a.describe_cluster().result(15)
    p = Producer({"bootstrap.servers": bs, "enable.idempotence": True, "compression.type": "gzip",
                  "linger.ms": 5})
    for i in range(6):
        p.produce(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("h", b"1")],
                  partition=i % 2)
    assert p.flush(15) == 0
    tp = TopicPartition(topic, 0)
    a.list_offsets({tp: OffsetSpec.latest()})[tp].result(15)
    a.delete_records([TopicPartition(topic, 1, 1)])
    c = Consumer({"bootstrap.servers": bs, "group.id": "capture", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    wait_until(lambda: c.poll(0.5), 15, "a record")
    c.get_watermark_offsets(tp, timeout=15)
    c.offsets_for_times([TopicPartition(topic, 0, int(time.time() * 1000) - 60_000)], timeout=15)
    c.close()
    a.delete_topics([doomed])[doomed].result(15)


def kafka_python_label() -> str:
    import kafka
    return f"kafka-python-{kafka.__version__}"


def kafka_python(bs: str) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewPartitions, NewTopic
    a = KafkaAdminClient(bootstrap_servers=bs, request_timeout_ms=15000)
    topic, doomed = unique("cap-kp"), unique("cap-kp-del")
    a.create_topics([NewTopic(topic, 2, 1, topic_configs={"retention.ms": "3600000"}),
                     NewTopic(doomed, 1, 1)])
    a.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)])
    a.create_partitions({topic: NewPartitions(total_count=3)})
    a.list_topics()
    p = KafkaProducer(bootstrap_servers=bs, acks="all", compression_type="gzip")
    for i in range(6):
        p.send(topic, key=f"k{i}".encode(), value=f"v{i}".encode(), headers=[("h", b"1")],
               partition=i % 2).get(timeout=15)
    p.close(timeout=15)
    c = KafkaConsumer(bootstrap_servers=bs, group_id=None, enable_auto_commit=False,
                      request_timeout_ms=20000)
    tp = TopicPartition(topic, 0)
    c.assign([tp])
    c.seek_to_beginning()
    wait_until(lambda: c.poll(timeout_ms=500), 15, "a record")
    c.end_offsets([tp])
    c.offsets_for_times({tp: int(time.time() * 1000) - 60_000})
    c.close()
    a.delete_topics([doomed])
    a.close()


def kcat_label() -> str:
    version = subprocess.run(["kcat", "-V"], capture_output=True, text=True, check=True).stdout
    words = version.split()
    return f"kcat-{words[words.index('Version') + 1]}-librdkafka-{words[words.index('librdkafka') + 1]}"


def kcat(bs: str) -> None:
    topic = unique("cap-kc")

    def run(*args, stdin=None):
        subprocess.run(["kcat", "-b", bs, "-m", "10", *args], input=stdin, check=True,
                       capture_output=True, timeout=60)
    run("-L")
    run("-P", "-t", topic, "-p", "0", "-K", ":", "-z", "snappy", "-H", "h=1", stdin=b"k1:v1\nk2:v2\n")
    run("-C", "-t", topic, "-e", "-o", "beginning")
    run("-C", "-t", topic, "-e", "-o", "-1")
    run("-Q", "-t", f"{topic}:0:{int(time.time() * 1000) - 60_000}")


# name -> (label, scenario)
CLIENTS = {"confluent": (confluent_label, confluent),
           "kafka-python": (kafka_python_label, kafka_python),
           "kcat": (kcat_label, kcat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--clients", default=",".join(CLIENTS))
    args = ap.parse_args()

    recorder = Recorder()
    proxy_port = free_port()
    with tempfile.TemporaryDirectory(prefix="keel-capture-") as tmp:
        broker = ProxiedBroker(Path(tmp) / "data", Path(tmp) / "broker.log", proxy_port)
        broker.start()
        proxy = Proxy(proxy_port, broker.port, recorder)
        bs = f"127.0.0.1:{proxy_port}"
        try:
            for name in args.clients.split(","):
                label_of, scenario = CLIENTS[name]
                with recorder.lock:
                    recorder.label = label_of()
                scenario(bs)
                # Let the clients' connections close before the next
                # client starts opening its own.
                gc.collect()
                with recorder.lock:
                    recorder.label = "unlabelled"
        except Exception:
            print(broker.log_tail(), file=sys.stderr)
            raise
        finally:
            proxy.stop()
            broker.stop()

    args.out.mkdir(parents=True, exist_ok=True)
    for label, frames in sorted(recorder.frames.items()):
        if label == "unlabelled":
            continue
        for old in args.out.glob(f"{label}__*.bin"):
            old.unlink()
        for (api_key, version), frame in sorted(frames.items()):
            cid = int.from_bytes(frame[4:8], "big", signed=True)
            name = f"{api_key}-{API_NAMES.get(api_key, 'api')}"
            path = args.out / f"{label}__{name}-v{version}__cid{cid}.bin"
            path.write_bytes(frame)
            print(f"{path.name}: {len(frame)} bytes")


if __name__ == "__main__":
    if shutil.which("kcat") is None:
        CLIENTS.pop("kcat")
    main()
