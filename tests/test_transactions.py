"""Transactions against a real broker with confluent-kafka's transactional
producer: committed records are visible to read_committed consumers and
aborted ones never are (read_uncommitted sees both), the last stable offset
holds read_committed readers at an open transaction, a second producer with
the same transactional id fences the first, an open transaction past its
timeout is aborted by the coordinator, a transaction left open by a
kill -9 is aborted after the restart while committed ones stay, offsets
sent in a transaction are committed only with it, and a
consume-transform-produce loop killed mid-transaction keeps each input
exactly once."""
from __future__ import annotations

import os
import random
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from conftest import unique, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic


def _txn_producer(bootstrap: str, txn_id: str, **overrides) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 5, **overrides})
    p.init_transactions(CLIENT_TIMEOUT_S)
    return p


def _read_all(bootstrap: str, topic: str, isolation: str, partitions: int = 1) -> list[bytes]:
    """Every value a consumer with this isolation level reads from the start
    until each partition reports its end (librdkafka's partition EOF: the
    high watermark, or for read_committed the last stable offset)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "enable.auto.commit": False,
                  "isolation.level": isolation, "auto.offset.reset": "earliest",
                  "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    values, at_end = [], set()
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    try:
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{topic}: only {sorted(at_end)} reached their end"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                if m.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                continue
            values.append(m.value())
    finally:
        c.close()
    return values


def _end_offsets(bootstrap: str, topic: str, isolation: str) -> tuple[int, int]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "isolation.level": isolation})
    try:
        return c.get_watermark_offsets(TopicPartition(topic, 0), timeout=CLIENT_TIMEOUT_S, cached=False)
    finally:
        c.close()


def test_commits_are_visible_and_aborts_never_are(broker):
    topic = unique("txn")
    create_topic(broker.bootstrap, topic, partitions=2)
    p = _txn_producer(broker.bootstrap, unique("tx"))
    expected_committed = []
    for round_ in range(6):
        p.begin_transaction()
        for i in range(20):
            value = b"r%d-%d" % (round_, i)
            p.produce(topic, value=value, partition=i % 2)
        if round_ % 2 == 0:
            p.commit_transaction(CLIENT_TIMEOUT_S)
            expected_committed += [b"r%d-%d" % (round_, i) for i in range(20)]
        else:
            p.flush(CLIENT_TIMEOUT_S)  # written, then aborted (unflushed ones are purged)
            p.abort_transaction(CLIENT_TIMEOUT_S)
    committed = _read_all(broker.bootstrap, topic, "read_committed", partitions=2)
    assert sorted(committed) == sorted(expected_committed)
    everything = _read_all(broker.bootstrap, topic, "read_uncommitted", partitions=2)
    assert len(everything) == 120, "read_uncommitted sees aborted records too"
    # After a restart the aborted-transaction index still hides the aborts.
    broker.restart()
    assert sorted(_read_all(broker.bootstrap, topic, "read_committed", partitions=2)) == sorted(expected_committed)


def test_an_open_transaction_holds_the_last_stable_offset(broker):
    topic = unique("lso")
    create_topic(broker.bootstrap, topic)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    plain.produce(topic, value=b"before")
    plain.flush(CLIENT_TIMEOUT_S)
    p = _txn_producer(broker.bootstrap, unique("tx"))
    p.begin_transaction()
    p.produce(topic, value=b"open")
    p.flush(CLIENT_TIMEOUT_S)
    wait_until(lambda: _end_offsets(broker.bootstrap, topic, "read_uncommitted")[1] == 2, 10, "the write")
    assert _end_offsets(broker.bootstrap, topic, "read_committed")[1] == 1, "LSO at the open transaction"
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"before"]
    p.commit_transaction(CLIENT_TIMEOUT_S)
    # The commit marker takes an offset: the LSO moves past it.
    wait_until(lambda: _end_offsets(broker.bootstrap, topic, "read_committed")[1] == 3, 10, "the LSO to advance")
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"before", b"open"]


def test_a_second_producer_with_the_same_id_fences_the_first(broker):
    topic = unique("fence")
    create_topic(broker.bootstrap, topic)
    txn_id = unique("tx")
    first = _txn_producer(broker.bootstrap, txn_id)
    first.begin_transaction()
    first.produce(topic, value=b"zombie")
    first.flush(CLIENT_TIMEOUT_S)
    second = _txn_producer(broker.bootstrap, txn_id)
    second.begin_transaction()
    second.produce(topic, value=b"live")
    second.commit_transaction(CLIENT_TIMEOUT_S)
    try:
        first.commit_transaction(CLIENT_TIMEOUT_S)
        raise AssertionError("the fenced producer committed")
    except KafkaException as e:
        err = e.args[0]
        assert err.fatal() or "fenced" in err.str().lower(), err
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"live"]


def _quick_abort_broker(broker_factory, prefix: str):
    """A broker that checks for timed-out transactions every 200 ms, and a
    fresh topic on it."""
    b = broker_factory({"transaction.abort.timed.out.transaction.cleanup.interval.ms": "200"})
    topic = unique(prefix)
    create_topic(b.bootstrap, topic)
    return b, topic


def test_a_transaction_past_its_timeout_is_aborted(broker_factory):
    b, topic = _quick_abort_broker(broker_factory, "timeout")
    p = _txn_producer(b.bootstrap, unique("tx"), **{"transaction.timeout.ms": 1500})
    p.begin_transaction()
    p.produce(topic, value=b"abandoned")
    p.flush(CLIENT_TIMEOUT_S)
    # The coordinator aborts it: the marker lands and the LSO moves past it.
    wait_until(lambda: _end_offsets(b.bootstrap, topic, "read_committed")[1] == 2, 15, "the timed-out abort")
    assert _read_all(b.bootstrap, topic, "read_committed") == []
    assert len(_read_all(b.bootstrap, topic, "read_uncommitted")) == 1


def test_kill9_mid_transaction_keeps_commits_and_aborts_the_open_one(broker_factory):
    b, topic = _quick_abort_broker(broker_factory, "crash")
    p = _txn_producer(b.bootstrap, unique("tx"), **{"transaction.timeout.ms": 3000})
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, value=b"c%d" % i)
    p.commit_transaction(CLIENT_TIMEOUT_S)
    p.begin_transaction()
    for i in range(50):
        p.produce(topic, value=b"open%d" % i)
    p.flush(CLIENT_TIMEOUT_S)
    b.kill9()
    b.start()
    # The open transaction is aborted once its timeout passes; the LSO then
    # reaches the log end.
    wait_until(lambda: _end_offsets(b.bootstrap, topic, "read_committed")[1]
               == _end_offsets(b.bootstrap, topic, "read_uncommitted")[1], 20, "the abort after restart")
    assert _read_all(b.bootstrap, topic, "read_committed") == [b"c%d" % i for i in range(50)]


def _committed(bootstrap: str, group: str, topic: str, partitions: int = 1, stable: bool = True) -> list[int]:
    """The group's committed offsets. `stable`: as a read_committed client
    asks for them (require_stable, KIP-447), waiting for the markers of an
    ended transaction, which are written after EndTxn is answered; else
    as a read_uncommitted one, which is answered at once."""
    isolation = "read_committed" if stable else "read_uncommitted"
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": isolation})
    try:
        tps = c.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=CLIENT_TIMEOUT_S)
        return [tp.offset for tp in tps]
    finally:
        c.close()


def _consume(c: Consumer, n: int) -> list:
    """Up to `n` messages: waits for the first (the group may be
    rebalancing), then stops at the first quiet second."""
    out = []
    deadline = time.monotonic() + CLIENT_TIMEOUT_S
    while len(out) < n:
        m = c.poll(1.0)
        if m is None:
            if out or time.monotonic() > deadline:
                break
            continue
        if not m.error():
            out.append(m)
    return out


def test_offsets_sent_in_a_transaction_are_committed_with_it(broker):
    source, sink, group = unique("src"), unique("sink"), unique("g")
    create_topic(broker.bootstrap, source)
    create_topic(broker.bootstrap, sink)
    plain = Producer({"bootstrap.servers": broker.bootstrap})
    for i in range(10):
        plain.produce(source, value=b"in%d" % i)
    plain.flush(CLIENT_TIMEOUT_S)
    c = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group, "enable.auto.commit": False,
                  "isolation.level": "read_committed", "auto.offset.reset": "earliest"})
    c.subscribe([source])
    got = _consume(c, 10)
    assert len(got) == 10
    p = _txn_producer(broker.bootstrap, unique("tx"))
    for commit in (False, True):
        p.begin_transaction()
        p.produce(sink, value=b"out")
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), CLIENT_TIMEOUT_S)
        p.flush(CLIENT_TIMEOUT_S)
        assert _committed(broker.bootstrap, group, source, stable=False) == [-1001], "invisible while open"
        if commit:
            p.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            p.abort_transaction(CLIENT_TIMEOUT_S)
        expected = [10] if commit else [-1001]
        assert _committed(broker.bootstrap, group, source) == expected
    c.close()
    # The committed offset survives a restart (the group log's marker).
    broker.restart()
    assert _committed(broker.bootstrap, group, source) == [10]


def test_kill9_mid_consume_transform_produce_keeps_each_input_exactly_once(broker_factory):
    """A consume-transform-produce loop (send_offsets_to_transaction) is
    killed with the broker mid-transaction, its output written and its
    offsets sent; after the restart a new instance takes over the same
    transactional id and group. read_committed output holds each input once."""
    b, source = _quick_abort_broker(broker_factory, "ctp-in")
    sink, group, txn_id = unique("ctp-out"), unique("ctp-g"), unique("ctp-tx")
    create_topic(b.bootstrap, sink)
    n = 400
    plain = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(n):
        plain.produce(source, value=b"%d" % i)
    plain.flush(CLIENT_TIMEOUT_S)

    def instance():
        p = _txn_producer(b.bootstrap, txn_id, **{"transaction.timeout.ms": 5000})
        # The old instance's member leaves the group by its session
        # timeout (it may not get to leave): keep that short.
        c = Consumer({"bootstrap.servers": b.bootstrap, "group.id": group, "enable.auto.commit": False,
                      "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                      "session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        c.subscribe([source])
        return p, c

    def one_transaction(p, c, commit=True) -> int:
        batch = _consume(c, 25)
        if not batch:
            return 0
        p.begin_transaction()
        for m in batch:
            p.produce(sink, value=b"out-" + m.value())
        p.send_offsets_to_transaction(c.position(c.assignment()), c.consumer_group_metadata(), CLIENT_TIMEOUT_S)
        if commit:
            p.commit_transaction(CLIENT_TIMEOUT_S)
        else:
            p.flush(CLIENT_TIMEOUT_S)
        return len(batch)

    p, c = instance()
    done = sum(one_transaction(p, c) for _ in range(4))
    assert done == 100
    assert one_transaction(p, c, commit=False) == 25  # written and offsets sent, not committed
    b.kill9()
    b.start()
    c.close()
    p, c = instance()  # fences the old producer; its open transaction is aborted
    remaining = n - done  # the aborted 25 again, then the rest
    while remaining > 0:
        processed = one_transaction(p, c)
        assert processed, f"{remaining} inputs never came"
        remaining -= processed
    c.close()
    out = _read_all(b.bootstrap, sink, "read_committed")
    assert sorted(out) == sorted(b"out-%d" % i for i in range(n)), (
        f"{len(out)} outputs, {len(set(out))} distinct, for {n} inputs")
    assert _committed(b.bootstrap, group, source) == [n]


def test_a_marker_from_a_forged_coordinator_is_refused(broker):
    """WriteTxnMarkers claiming a coordinator newer than Keel's would fence
    the real coordinator's markers out and leave the transaction open
    forever: it is INVALID_REQUEST, and the transaction still commits."""
    import hardening_wire as hw
    import kafka_wire as w

    topic = unique("forged")
    create_topic(broker.bootstrap, topic)
    p = _txn_producer(broker.bootstrap, unique("tx"))
    p.begin_transaction()
    p.produce(topic, value=b"kept")
    p.flush(CLIENT_TIMEOUT_S)
    with w.Conn(broker.bootstrap) as conn:
        for producer_id in range(4):
            assert hw.write_txn_markers(conn, topic, 0, producer_id, 0, False, coordinator_epoch=1000) == 42
        assert hw.write_txn_markers(conn, unique("nope"), 0, 0, 0, False, coordinator_epoch=0) == 3
    p.commit_transaction(CLIENT_TIMEOUT_S)
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"kept"]


def test_transactions_v2_bump_the_epoch_and_fence_the_ended_transactions_zombie(broker):
    """Transactions v2 on the wire (KIP-890): Produce v12 adds its partition
    to the transaction itself; EndTxn v5 bumps the epoch and answers with
    it, and a retry of it gets the same answer; a late write of the ended
    transaction (its old epoch) is fenced and never appears; the next
    transaction starts its sequences at 0; EndTxn at an epoch no client
    holds is PRODUCER_FENCED and harms nothing."""
    import hardening_wire as hw
    import kafka_wire as w

    producer_fenced, invalid_epoch, concurrent_transactions = 90, 47, 51
    topic, txn = unique("tv2"), unique("tv2-tx")
    create_topic(broker.bootstrap, topic)
    with w.Conn(broker.bootstrap) as conn:
        err, pid, epoch = hw.init_producer_id(conn, transactional_id=txn)
        assert (err, epoch) == (0, 0)

        def produce(value: bytes, epoch: int, seq: int) -> int:
            batch = w.record_batch([(None, value)], producer_id=pid, producer_epoch=epoch,
                                   base_sequence=seq, attributes=hw.TRANSACTIONAL)
            return hw.produce_v12(conn, topic, 0, batch, txn)[0]

        assert produce(b"first", 0, 0) == 0
        assert hw.end_txn_v5(conn, txn, pid, 0, True) == (0, pid, 1)
        # The answer was lost; the client asks again with the epoch it had.
        # Until the markers are written that is CONCURRENT_TRANSACTIONS.
        wait_until(lambda: hw.end_txn_v5(conn, txn, pid, 0, True) == (0, pid, 1), 10,
                   "the retried commit's answer")
        # Refused as Kafka refuses a produce its coordinator fences.
        assert produce(b"zombie", 0, 1) == invalid_epoch
        assert hw.end_txn_v5(conn, txn, pid, 0, False)[0] != 0, "an abort is no retry of a commit"
        # It waits for the markers of the last (add.partitions.to.txn.
        # retry.backoff.max.ms), then answers CONCURRENT_TRANSACTIONS.
        answers = []
        wait_until(lambda: answers.append(produce(b"second", 1, 0)) or answers[-1] != concurrent_transactions,
                   10, "the next transaction's first write")
        assert answers[-1] == 0, answers
        for forged in (5, 32767, -1):
            assert hw.end_txn_v5(conn, txn, pid, forged, True)[0] == producer_fenced
        assert hw.end_txn_v5(conn, txn, pid + 1000, 1, True)[0] == 49  # INVALID_PRODUCER_ID_MAPPING
        assert hw.end_txn_v5(conn, txn, pid, 1, False) == (0, pid, 2)
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"first"]
    assert _read_all(broker.bootstrap, topic, "read_uncommitted") == [b"first", b"second"]


def test_kill9_after_aborts_that_rolled_segments_keeps_them_hidden(broker):
    """Transactions larger than a segment, so each one's marker rolls the
    segment and lands in a segment of its own, committed or aborted at
    random, the last before each kill -9 an abort: after every restart a
    read_committed consumer reads exactly the committed records (the
    aborted-transaction index of the newest segment lives in memory until
    its seal, and start-up must rebuild it from the markers)."""
    seed = int(os.environ.get("KEEL_TEST_SEED", random.randrange(1 << 30)))
    rng = random.Random(seed)
    print(f"kill9 aborts: seed={seed} (replay with KEEL_TEST_SEED={seed})")
    topic = unique("rolls")
    create_topic(broker.bootstrap, topic, config={"segment.bytes": "4096"})
    txn_id = unique("tx")
    committed: list[bytes] = []
    for round_ in range(4):
        p = _txn_producer(broker.bootstrap, txn_id)
        for t in range(rng.randrange(2, 5)):
            commit = rng.random() < 0.5
            values = [b"r%d-t%d-%d-%s" % (round_, t, i, b"x" * 300) for i in range(20)]
            p.begin_transaction()
            for v in values:
                p.produce(topic, value=v)
            p.flush(CLIENT_TIMEOUT_S)
            if commit:
                p.commit_transaction(CLIENT_TIMEOUT_S)
                committed.extend(values)
            else:
                p.abort_transaction(CLIENT_TIMEOUT_S)
        # An abort last, its marker alone in the newest segment; the roll's
        # producer snapshot is written off the append path, so give it a
        # moment.
        p.begin_transaction()
        for i in range(20):
            p.produce(topic, value=b"r%d-last-%d-%s" % (round_, i, b"y" * 300))
        p.flush(CLIENT_TIMEOUT_S)
        p.abort_transaction(CLIENT_TIMEOUT_S)
        time.sleep(rng.uniform(0.2, 0.6))
        broker.kill9()
        broker.start()
        got = _read_all(broker.bootstrap, topic, "read_committed")
        assert got == committed, (
            f"after kill -9 #{round_ + 1} (seed {seed}): {len(got)} records read_committed, "
            f"{len(committed)} committed; aborted ones served: "
            f"{[v[:12] for v in got if v not in set(committed)][:3]}")


def test_a_marker_of_a_deleted_topic_stays_out_of_its_re_created_namesake(broker):
    """Markers are addressed by topic name. A transaction that wrote to a
    topic which is then deleted and created again commits cleanly, and its
    marker does not land in the new topic: the producer never wrote there,
    so the new topic stays empty (end offset 0, not 1)."""
    from kclient import admin, topic_absent

    topic = unique("recreated")
    create_topic(broker.bootstrap, topic)
    p = _txn_producer(broker.bootstrap, unique("tx"))
    p.begin_transaction()
    p.produce(topic, value=b"into the old topic")
    p.flush(CLIENT_TIMEOUT_S)
    a = admin(broker.bootstrap)
    a.delete_topics([topic], operation_timeout=CLIENT_TIMEOUT_S)[topic].result(CLIENT_TIMEOUT_S)
    wait_until(lambda: topic_absent(broker.bootstrap, topic), CLIENT_TIMEOUT_S, f"{topic} gone")

    def created():
        try:
            create_topic(broker.bootstrap, topic)
            return True
        except KafkaException as e:
            assert e.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS, e
            return False
    wait_until(created, CLIENT_TIMEOUT_S, f"{topic} created again")
    p.commit_transaction(CLIENT_TIMEOUT_S)
    assert _end_offsets(broker.bootstrap, topic, "read_uncommitted") == (0, 0)
    # The producer's next transaction writes to the new topic as usual.
    p.begin_transaction()
    p.produce(topic, value=b"into the new topic")
    p.commit_transaction(CLIENT_TIMEOUT_S)
    assert _read_all(broker.bootstrap, topic, "read_committed") == [b"into the new topic"]
    assert _end_offsets(broker.bootstrap, topic, "read_uncommitted") == (0, 2)
