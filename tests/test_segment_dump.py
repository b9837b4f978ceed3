"""`keel segment dump` agrees with Apache Kafka's DumpLogSegments
(kafka-dump-log.sh) on a segment a real Keel broker wrote: the same batches
at the same byte positions, with the same offsets, counts, codecs and CRCs,
and, once the broker closed the segment, the same offset index."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from confluent_kafka import Producer

from conftest import unique
from kclient import CLIENT_TIMEOUT_S, create_topic

import kafka_tools

BATCH_LINE = re.compile(
    r"^baseOffset: (\d+) lastOffset: (\d+) count: (\d+) .*? position: (\d+) .*? size: (\d+) "
    r"magic: (\d) compresscodec: (\w+) crc: (\d+) isvalid: (\w+)$", re.M)
INDEX_LINE = re.compile(r"^offset: (\d+) position: (\d+)$", re.M)


def keel_dump(bin_path: Path, *args: str) -> list[dict]:
    done = subprocess.run([str(bin_path), "segment", "dump", "--json", *args],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"exit {done.returncode}:\n{done.stdout[-2000:]}\n{done.stderr}"
    return [json.loads(line) for line in done.stdout.splitlines()]


def _produce(bootstrap: str, topic: str) -> int:
    """Batches in every codec, keys and headers; returns the record count."""
    n = 0
    for codec in ("none", "gzip", "snappy", "lz4", "zstd") * 2:
        p = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
                      "enable.idempotence": codec != "none"})
        for i in range(7):
            p.produce(topic, key=b"key-%d" % n, value=(b"value-%d-" % n) * (i + 1), partition=0,
                      headers=[("codec", codec.encode())])
            n += 1
        assert p.flush(CLIENT_TIMEOUT_S) == 0
    return n


def test_segment_dump_agrees_with_kafkas_dump_log_segments(broker_factory):
    b = broker_factory()
    topic = unique("dump")
    create_topic(b.bootstrap, topic, 1, {"index.interval.bytes": "1"})
    produced = _produce(b.bootstrap, topic)
    segment = b.data_dir / f"{topic}-0" / f"{0:020d}.log"

    # The active segment, read while the broker runs.
    lines = keel_dump(b.bin, str(segment), "--records")
    ours = [(l["base_offset"], l["last_offset"], l["records_count"], l["position"], l["length"],
             l["magic"], l["codec"], l["crc"], l["crc_valid"])
            for l in lines if l["type"] == "batch"]
    kafka = [(int(m[0]), int(m[1]), int(m[2]), int(m[3]), int(m[4]), int(m[5]), m[6], int(m[7]),
              m[8] == "true")
             for m in BATCH_LINE.findall(kafka_tools.dump_log_segments(segment, deep=False))]
    assert ours == kafka, f"keel:  {ours}\nkafka: {kafka}"
    assert len(ours) >= 10 and {o[6] for o in ours} == {"none", "gzip", "snappy", "lz4", "zstd"}, ours
    assert sum(o[2] for o in ours) == produced
    summary = lines[-1]
    assert summary["type"] == "summary" and summary["problems"] == 0, summary
    assert summary["records"] == produced, summary

    # Closed: the broker wrote the segment's indexes; both tools read the
    # same entries, and Keel finds them consistent with the log.
    b.stop()
    index = segment.with_suffix(".index")
    ours = [(l["offset"], l["position"]) for l in keel_dump(b.bin, str(index), "--verify-index")
            if l["type"] == "offset_index_entry"]
    kafka = [(int(o), int(p)) for o, p in INDEX_LINE.findall(kafka_tools.dump_log_segments(index, deep=False))]
    assert ours == kafka and len(ours) >= 9, f"keel:  {ours}\nkafka: {kafka}"
    verified = keel_dump(b.bin, str(segment), "--verify-index")
    # Offset entries plus at least one time entry, none disagreeing.
    assert verified[-1]["mismatches"] == 0 and verified[-1]["index_entries"] > len(ours), verified[-1]
