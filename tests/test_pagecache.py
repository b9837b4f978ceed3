"""Keel's data files stay out of the page cache: written data leaves it
after writeback, and a backfill from offset 0 (read with O_DIRECT) does not
bring it back. Counts, not timings."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from conftest import IMPL, unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from pagecache import segment_residency

RECORDS = 40_000
VALUE = 500  # ~20 MB of segments


def _fs_type(path) -> str:
    best, fstype = "", ""
    with open("/proc/mounts") as f:
        for line in f:
            _dev, mnt, typ = line.split()[:3]
            if str(path).startswith(mnt) and len(mnt) > len(best):
                best, fstype = mnt, typ
    return fstype


@pytest.mark.skipif(IMPL != "keel", reason="Keel's page-cache behaviour")
def test_segments_stay_out_of_the_page_cache(broker_factory):
    b = broker_factory({"keel.tail.cache.bytes": str(1 << 20), "log.segment.bytes": str(4 << 20)})
    if _fs_type(b.data_dir) == "tmpfs":
        pytest.skip("on tmpfs the files are the page cache")
    bs, topic = b.bootstrap, unique("pc")
    create_topic(bs, topic, 1)
    p = Producer({"bootstrap.servers": bs, "linger.ms": 20, "acks": "all"})
    for i in range(RECORDS):
        p.produce(topic, key=str(i).encode(), value=(b"%08d" % i) * (VALUE // 8))
        if i % 5000 == 0:
            p.poll(0)
    assert p.flush(CLIENT_TIMEOUT_S * 2) == 0

    def fraction():
        resident, total = segment_residency(b.data_dir)
        return resident / max(total, 1), resident, total

    # Written data leaves the page cache once written back.
    wait_until(lambda: fraction()[0] < 0.05, 30, "written segments to leave the page cache")
    _, _, total = fraction()
    assert total > 15 << 20

    # Backfill: everything from offset 0 with a real client.
    c = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), "enable.auto.commit": False,
                  "fetch.max.bytes": 4 << 20})
    c.assign([TopicPartition(topic, 0, 0)])
    seen = 0
    while seen < RECORDS:
        m = c.poll(5)
        assert m is not None, f"stalled at {seen}"
        assert not m.error(), m.error()
        assert m.offset() == seen and m.value() == (b"%08d" % seen) * (VALUE // 8)
        seen += 1
    c.close()
    frac, resident, total = fraction()
    assert frac < 0.05, f"after the backfill {resident} of {total} segment bytes are in the page cache"


@pytest.mark.skipif(IMPL != "keel", reason="Keel's read modes")
@pytest.mark.parametrize("mode", ["auto", "off"])
def test_a_data_dir_on_tmpfs_works_in_every_read_mode(tmp_path, mode):
    """tmpfs took no O_DIRECT before Linux 6.6: `auto` then falls back to
    pread + DONTNEED (and says so); `off` always reads that way. Either way
    a backfill through a small tail cache reads back every byte."""
    import shutil
    import tempfile

    from conftest import Broker, _live_brokers
    if not os.path.isdir("/dev/shm"):
        pytest.skip("no /dev/shm")
    data = Path(tempfile.mkdtemp(prefix="keel-shm-", dir="/dev/shm"))
    b = Broker(data / "data", tmp_path / "broker.log",
               {"keel.io.direct": mode, "keel.tail.cache.bytes": str(64 << 10)})
    _live_brokers.append(b)
    try:
        b.start()
        bs, topic = b.bootstrap, unique("shm")
        create_topic(bs, topic, 1)
        p = Producer({"bootstrap.servers": bs, "linger.ms": 5})
        for i in range(5000):
            p.produce(topic, value=b"%06d" % i * 50)
        assert p.flush(CLIENT_TIMEOUT_S) == 0
        c = Consumer({"bootstrap.servers": bs, "group.id": unique("g"), "enable.auto.commit": False})
        c.assign([TopicPartition(topic, 0, 0)])
        for i in range(5000):
            m = c.poll(10)
            assert m is not None and not m.error(), m and m.error()
            assert m.offset() == i and m.value() == b"%06d" % i * 50
        c.close()
        log = b.log_tail()
        said = "O_DIRECT" in log or "DONTNEED" in log
        assert said, "the broker names its read mode at start-up"
    finally:
        _live_brokers.remove(b)
        b.close()
        shutil.rmtree(data, ignore_errors=True)
