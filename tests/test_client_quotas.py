"""Client quotas: `kafka-configs --entity-type users / clients` (Apache
Kafka's ConfigCommand from the 4.3.1 jars) and AlterClientQuotas /
DescribeClientQuotas on the wire, against Keel. The answers to bad
requests are Kafka 4.3.1's own, probed on it; the rates are held by
Kafka's own ProducerPerformance and ConsumerPerformance."""
from __future__ import annotations

import math
import re
import time

import kafka_tools
import kafka_wire as w
import quota_wire as q
from conftest import IMPL, wait_until
from kclient import create_topic
from test_metrics import sample, scrape
from test_operator_tools import kafka_configs

INVALID_REQUEST, UNSUPPORTED_VERSION = 42, 35


def quota_lines(bootstrap: str, *entity: str) -> list[str]:
    """`kafka-configs --describe` of quota entities: its lines, sorted."""
    done = kafka_configs(bootstrap, "--describe", *entity)
    return sorted(line.strip() for line in done.stdout.splitlines() if line.startswith("Quota configs"))


def test_kafka_configs_sets_describes_and_deletes_quotas_that_survive_a_kill(broker_factory):
    b = broker_factory({})
    alter = ("--alter", "--add-config")
    kafka_configs(b.bootstrap, "--entity-type", "users", "--entity-default", *alter, "producer_byte_rate=5000000")
    kafka_configs(b.bootstrap, "--entity-type", "users", "--entity-name", "alice", *alter,
                  "consumer_byte_rate=2000000,producer_byte_rate=3000000")
    kafka_configs(b.bootstrap, "--entity-type", "clients", "--entity-name", "perf", *alter,
                  "producer_byte_rate=1048576")
    kafka_configs(b.bootstrap, "--entity-type", "users", "--entity-name", "alice", "--entity-type", "clients",
                  "--entity-default", *alter, "consumer_byte_rate=4000000")
    users = quota_lines(b.bootstrap, "--entity-type", "users")
    assert users == [
        "Quota configs for the default user-principal are producer_byte_rate=5000000.0",
        "Quota configs for user-principal 'alice' are consumer_byte_rate=2000000.0, producer_byte_rate=3000000.0",
    ], users
    assert quota_lines(b.bootstrap, "--entity-type", "clients", "--entity-name", "perf") == [
        "Quota configs for client-id 'perf' are producer_byte_rate=1048576.0"]
    # The same on the wire: every entity naming a user, and strictly one.
    code, _, entries = q.describe(b.bootstrap, [("user", q.ANY, None)])
    assert code == 0 and {tuple(e) for e, _ in entries} == {
        (("client-id", None), ("user", "alice")), (("user", None),), (("user", "alice"),)}, entries
    code, _, entries = q.describe(b.bootstrap, [("user", q.EXACT, "alice")], strict=True)
    assert entries == [([("user", "alice")], {"consumer_byte_rate": 2000000.0, "producer_byte_rate": 3000000.0})]

    b.kill9()
    b.start()
    assert quota_lines(b.bootstrap, "--entity-type", "users") == users
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "users", "--entity-name", "alice",
                  "--delete-config", "producer_byte_rate,consumer_byte_rate")
    assert quota_lines(b.bootstrap, "--entity-type", "users") == [
        "Quota configs for the default user-principal are producer_byte_rate=5000000.0"]
    _, _, entries = q.describe(b.bootstrap, [])
    assert {tuple(e) for e, _ in entries} == {
        (("client-id", None), ("user", "alice")), (("client-id", "perf"),), (("user", None),)}, entries


# (entity, ops, error code, message): what Kafka 4.3.1 answers.
REFUSED = [
    ([("user", "alice")], [("foo_rate", 100, False)], INVALID_REQUEST, "Invalid configuration key foo_rate"),
    ([("user", "alice")], [("producer_byte_rate", 1000.5, False)], INVALID_REQUEST,
     "producer_byte_rate cannot be a fractional value."),
    ([("user", "alice")], [("producer_byte_rate", 0, False)], INVALID_REQUEST,
     "Quota producer_byte_rate must be greater than 0"),
    ([("client-id", "c1")], [("consumer_byte_rate", -1, False)], INVALID_REQUEST,
     "Quota consumer_byte_rate must be greater than 0"),
    ([("user", "huge")], [("producer_byte_rate", 1e20, False)], INVALID_REQUEST,
     "Proposed value for producer_byte_rate is too large for a LONG."),
    ([("ip", "1.2.3.4"), ("user", "alice")], [("connection_creation_rate", 10, False)], INVALID_REQUEST,
     "Invalid quota entity combination, IP entity shouldnot be combined with User or ClientId"),
    ([("user", "alice")], [("connection_creation_rate", 10, False)], INVALID_REQUEST,
     "Invalid configuration key connection_creation_rate"),
    ([("ip", "1.2.3.4")], [("producer_byte_rate", 10, False)], INVALID_REQUEST,
     "Invalid configuration key producer_byte_rate"),
    ([("ip", "not-an-ip")], [("connection_creation_rate", 10, False)], INVALID_REQUEST,
     "not-an-ip is not a valid IP or resolvable host."),
    ([("group", "g1")], [("producer_byte_rate", 10, False)], INVALID_REQUEST,
     "Unhandled client quota entity type: group"),
    ([], [("producer_byte_rate", 10, False)], INVALID_REQUEST, "Invalid empty client quota entity"),
    ([("user", "")], [("producer_byte_rate", 10, False)], INVALID_REQUEST, "Empty user not supported"),
    ([("client-id", "")], [("producer_byte_rate", 10, False)], INVALID_REQUEST, "Empty client-id not supported"),
    ([("user", "twice")], [("producer_byte_rate", 10, False), ("producer_byte_rate", 20, False)], INVALID_REQUEST,
     "Ignoring duplicate entity ClientQuotaEntity(entries={user=twice})"),
]


def described(bootstrap: str, components, expected) -> None:
    """DescribeClientQuotas answers `expected`. Keel does at once; Kafka
    once its brokers' metadata has caught up with the controller (the same
    tests run against Kafka with KEEL_TEST_IMPL=kafka)."""
    wait_until(lambda: q.describe(bootstrap, components)[2] == expected, 10,
               f"quotas {components} to be {expected}")


def answers(got: list[tuple[int, str | None, q.Entity]]) -> dict:
    """AlterClientQuotas' answers by entity (Kafka's come in its hash map's order)."""
    return {tuple(sorted(entity)): (code, message) for code, message, entity in got}


def test_client_quota_changes_are_refused_as_kafka_does(broker):
    """Each refused entry gets Kafka's code and message, and the entries
    beside it in the same request still apply; validate_only changes
    nothing; removing what is not set is fine, as in Kafka."""
    for entity, ops, code, message in REFUSED:
        # One request each: Kafka answers a request once per entity.
        [(got_code, got_message, echoed)] = q.alter(broker.bootstrap, [(entity, ops)])
        assert (got_code, got_message) == (code, message), (entity, got_code, got_message)
        assert sorted(echoed) == sorted(entity)  # Kafka's order is its hash map's
    # A refused entry leaves the others of its request to apply.
    got = q.alter(broker.bootstrap, [([("user", "bad")], [("foo_rate", 1, False)]),
                                     ([("user", "ok")], [("producer_byte_rate", 1000, False)])])
    assert answers(got) == {(("user", "bad"),): (INVALID_REQUEST, "Invalid configuration key foo_rate"),
                            (("user", "ok"),): (0, None)}, got
    described(broker.bootstrap, [], [([("user", "ok")], {"producer_byte_rate": 1000.0})])
    # An entity named twice in one request: one answer, "Ignoring duplicate
    # entity", and the first entry's change stands.
    got = q.alter(broker.bootstrap, [([("client-id", "dup")], [("producer_byte_rate", 100, False)]),
                                     ([("client-id", "dup")], [("consumer_byte_rate", 200, False)])])
    assert answers(got) == {(("client-id", "dup"),): (
        INVALID_REQUEST, "Ignoring duplicate entity ClientQuotaEntity(entries={client-id=dup})")}, got
    described(broker.bootstrap, [("client-id", q.EXACT, "dup")], [([("client-id", "dup")], {"producer_byte_rate": 100.0})])
    q.alter(broker.bootstrap, [([("client-id", "dup")], [("producer_byte_rate", 0, True)])])

    assert q.alter(broker.bootstrap, [([("user", "vo")], [("consumer_byte_rate", 5, False)])],
                   validate_only=True) == [(0, None, [("user", "vo")])]
    assert q.alter(broker.bootstrap, [([("user", "nobody")], [("foo_rate", 0, True)])])[0][0] == 0
    described(broker.bootstrap, [], [([("user", "ok")], {"producer_byte_rate": 1000.0})])



def test_client_quota_filters_are_checked_as_kafka_does(broker):
    q.alter(broker.bootstrap, [([("user", "alice")], [("producer_byte_rate", 1000, False)]),
                               ([("user", None), ("client-id", None)], [("consumer_byte_rate", 60, False)]),
                               ([("client-id", "c1")], [("consumer_byte_rate", 3000, False)])])
    for components, code, message in [
        ([("user", q.EXACT, None)], INVALID_REQUEST, "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ([("user", q.DEFAULT, "alice")], INVALID_REQUEST,
         "Request specified MATCH_TYPE_DEFAULT, but also specified a match string."),
        ([("user", q.ANY, "alice")], INVALID_REQUEST,
         "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string."),
        ([("user", 3, None)], INVALID_REQUEST, "Unknown match type 3"),
        ([("group", q.ANY, None)], UNSUPPORTED_VERSION, "Unsupported entity type group"),
        # One pass over the components, in order.
        ([("user", q.ANY, None), ("user", q.ANY, None), ("group", q.ANY, None)], INVALID_REQUEST,
         "Entity type user cannot appear more than once in the filter."),
        ([("user", q.ANY, None), ("group", q.ANY, None), ("user", q.ANY, None)], UNSUPPORTED_VERSION,
         "Unsupported entity type group"),
        ([("group", q.ANY, None), ("", q.ANY, None)], UNSUPPORTED_VERSION, "Unsupported entity type group"),
        ([("user", q.EXACT, None), ("group", q.ANY, None)], INVALID_REQUEST,
         "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ([("user", q.ANY, None), ("user", q.EXACT, None)], INVALID_REQUEST,
         "Entity type user cannot appear more than once in the filter."),
        ([("ip", q.ANY, None), ("user", q.EXACT, None)], INVALID_REQUEST,
         "Request specified MATCH_TYPE_EXACT, but set match string to null."),
        ([("", q.ANY, None)], INVALID_REQUEST, "Invalid empty entity type."),
        ([("user", q.ANY, None), ("user", q.DEFAULT, None)], INVALID_REQUEST,
         "Entity type user cannot appear more than once in the filter."),
        ([("ip", q.ANY, None), ("user", q.ANY, None)], INVALID_REQUEST,
         "Invalid entity filter component combination. IP filter component should not be used with user or "
         "clientId filter component."),
    ]:
        assert q.describe(broker.bootstrap, components) == (code, message, None), components
    _, _, entries = q.describe(broker.bootstrap, [("user", q.DEFAULT, None)])
    assert entries == [([("client-id", None), ("user", None)], {"consumer_byte_rate": 60.0})]
    _, _, entries = q.describe(broker.bootstrap, [("client-id", q.ANY, None)], strict=True)
    assert entries == [([("client-id", "c1")], {"consumer_byte_rate": 3000.0})]
    # Kafka answers an empty message, not a null one.
    assert q.describe(broker.bootstrap, [("user", q.EXACT, "nobody")]) == (0, "", [])


MIB = 1 << 20


def test_kafkas_perf_tools_are_held_to_their_byte_rates(broker_factory):
    """A producer and a consumer with a quota of 1 MiB/s each, measured by
    Kafka's own ProducerPerformance, ConsumerPerformance and (a share
    group) ShareConsumerPerformance over ~20 MiB.

    Kafka's rate allows a first burst of `quota.window.num - 1` windows'
    worth before it throttles, and a window that leaves the rate lets the
    next burst through: with the default 11 windows of 1 s, a 20 s run is
    dominated by those bursts (10 MiB each). Two windows keep a burst at
    one second's worth, so a 20 s run shows the rate held."""
    b = broker_factory({"quota.window.num": "2"})
    topic = "quota-perf"
    create_topic(b.bootstrap, topic, partitions=1)
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "perf-p",
                  "--add-config", f"producer_byte_rate={MIB}")
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "perf-c",
                  "--add-config", f"consumer_byte_rate={MIB}")
    records, size = 20_000, 1024

    done = kafka_tools.run("org.apache.kafka.tools.ProducerPerformance", "--topic", topic,
                           "--num-records", str(records), "--record-size", str(size), "--throughput", "-1",
                           "--command-property", f"bootstrap.servers={b.bootstrap}", "client.id=perf-p", "acks=1",
                           timeout_s=90)
    assert done.returncode == 0, done.stderr[-3000:]
    # "20000 records sent, 1027.9 records/sec (1.00 MB/sec), ..." (MB: MiB)
    sent = re.search(rf"{records} records sent, ([\d.]+) records/sec", done.stdout)
    assert sent, done.stdout[-2000:]
    produced_mib_s = float(sent.group(1)) * size / MIB
    print(f"producer_byte_rate {MIB} B/s: ProducerPerformance {produced_mib_s:.3f} MiB/s")
    assert 0.9 <= produced_mib_s <= 1.1, done.stdout[-2000:]

    # --fetch-size is max.partition.fetch.bytes: a fetch far smaller than
    # a second's worth, so that whole fetches can meet the rate.
    done = kafka_tools.run("org.apache.kafka.tools.ConsumerPerformance", "--topic", topic,
                           "--bootstrap-server", b.bootstrap, "--num-records", str(records),
                           "--fetch-size", "65536", "--timeout", "60000",
                           "--command-property", "client.id=perf-c", timeout_s=90)
    assert done.returncode == 0, done.stderr[-3000:]
    # The last column but one is fetch.MB.sec: the rate after the group's join.
    row = done.stdout.strip().splitlines()[-1].split(", ")
    consumed_mib, fetch_mib_s = float(row[2]), float(row[-2])
    print(f"consumer_byte_rate {MIB} B/s: ConsumerPerformance {fetch_mib_s:.3f} MiB/s ({consumed_mib:.1f} MiB)")
    assert consumed_mib >= records * size / MIB * 0.99
    assert 0.9 <= fetch_mib_s <= 1.1, done.stdout[-2000:]

    # A share group's ShareFetch is held to the same consumer_byte_rate.
    # ShareConsumerPerformance's rate counts from its start, join included.
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "groups", "--entity-name", "perf-share",
                  "--add-config", "share.auto.offset.reset=earliest")
    done = kafka_tools.run("org.apache.kafka.tools.ShareConsumerPerformance", "--topic", topic,
                           "--bootstrap-server", b.bootstrap, "--group", "perf-share",
                           "--num-records", str(records), "--timeout", "60000",
                           "--command-property", "client.id=perf-c", timeout_s=90)
    assert done.returncode == 0, done.stderr[-3000:]
    # start.time, end.time, data.consumed.in.MB, MB.sec, nMsg.sec, data.consumed.in.nMsg
    row = done.stdout.strip().splitlines()[-1].split(", ")
    consumed_mib, share_mib_s = float(row[2]), float(row[3])
    print(f"consumer_byte_rate {MIB} B/s: ShareConsumerPerformance {share_mib_s:.3f} MiB/s ({consumed_mib:.1f} MiB)")
    assert consumed_mib >= records * size / MIB * 0.99
    assert 0.7 <= share_mib_s <= 1.1, done.stdout[-2000:]


def test_connections_over_their_address_connection_creation_rate_are_closed_unanswered(broker):
    """`connection_creation_rate` for 127.0.0.1 (KIP-612): with Kafka's 11
    windows a first burst of ten seconds' worth is served; every connection
    past it is held unread and closed (after at most one window), and is
    not counted against the rate. Without the quota, all are served."""
    b = broker
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "ips", "--entity-name", "127.0.0.1",
                  "--add-config", "connection_creation_rate=5")
    started = time.monotonic()
    # One connection after the quota is set, counted against it.
    assert q.describe(b.bootstrap, [("ip", q.EXACT, "127.0.0.1")]) == (
        0, "", [([("ip", "127.0.0.1")], {"connection_creation_rate": 5.0})])

    def attempt(n: int) -> tuple[int, int]:
        """Opens n connections at once, asks each for ApiVersions: -> (answered, closed)."""
        conns = [w.Conn(b.bootstrap, timeout_s=15) for _ in range(n)]
        answered = closed = 0
        for i, c in enumerate(conns):
            try:
                c.send(w.api_versions_request(0, i))
            except (BrokenPipeError, ConnectionResetError):
                pass
        for c in conns:
            try:
                c.recv_response()
                answered += 1
            except (ConnectionError, ConnectionResetError):
                closed += 1
            c.close()
        return answered, closed

    # 5/s measured over at least 10 s: 50 connections at once are within
    # the rate (49 after the one above), and 5 more for every second the
    # connections took to arrive (bounded by the whole time since the
    # quota was set: a loaded machine may accept them over a second or two).
    answered, closed = attempt(80)
    took_s = time.monotonic() - started
    print(f"connection_creation_rate 5/s: {answered} of 80 connections served, {closed} closed unanswered "
          f"(in {took_s:.2f} s)")
    assert 49 <= answered <= 49 + math.ceil(5 * took_s) and answered + closed == 80, (answered, closed, took_s)
    if b.admin:
        families = scrape(b)
        assert sample(families, "keel_quota_throttled_total", quota="connection_creation_rate") == closed
        assert sample(families, "keel_connections_accepted_total") >= answered

    kafka_configs(b.bootstrap, "--alter", "--entity-type", "ips", "--entity-name", "127.0.0.1",
                  "--delete-config", "connection_creation_rate")
    assert attempt(40) == (40, 0)


def api_versions_throttles(bootstrap: str, client_id: str, requests: int, enough: int) -> list[int]:
    """Sends ApiVersions v2 as `client_id`, one at a time, until `requests`
    are answered or `enough` were throttled: -> every throttle_time_ms."""
    throttles = []
    with w.Conn(bootstrap, timeout_s=30) as c:
        for i in range(requests):
            c.send(w.frame(w.header_v1(w.API_VERSIONS, 2, i, client_id)))
            cid, body = c.recv_response()
            assert cid == i
            r = w.Reader(body)
            assert r.i16() == 0
            r.take(6 * r.i32())  # (api key, min, max) per API
            throttles.append(r.i32())
            if sum(t > 0 for t in throttles) >= enough:
                break
    return throttles


def test_request_percentage_throttles_a_busy_client_and_not_another(broker_factory):
    """request_percentage=0.5 (5 ms of request handling per second) for one
    client id: a client sending requests back to back is throttled within a
    few hundred; another client id, without a quota, never is."""
    b = broker_factory({"quota.window.num": "2"})
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "busy",
                  "--add-config", "request_percentage=0.5")
    busy = api_versions_throttles(b.bootstrap, "busy", 2000, enough=5)
    throttled = [t for t in busy if t > 0]
    print(f"request_percentage 0.5: {len(busy)} requests, throttled {throttled} ms")
    assert len(throttled) == 5, busy
    # Bounded by one window (quota.window.size.seconds), as in Kafka.
    assert max(throttled) <= 1000, throttled
    assert api_versions_throttles(b.bootstrap, "calm", 300, enough=1) == [0] * 300
    if b.admin:
        assert sample(scrape(b), "keel_quota_throttled_total", quota="request_percentage") == 5


THROTTLING_QUOTA_EXCEEDED = 89


def test_controller_mutation_rate_refuses_creations_once_the_bucket_is_empty(broker):
    """controller_mutation_rate=0.1 partitions/s (KIP-599): Kafka's token
    bucket holds ten windows' worth, one partition. A creation that finds
    it not empty is done even if it overdraws it; the next is refused with
    THROTTLING_QUOTA_EXCEEDED and the time until the bucket is back at
    zero. CreateTopics v5 clients, which do not know that error, are
    throttled instead. Other client ids are not held."""
    b = broker
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "clients", "--entity-name", "mutator",
                  "--add-config", "controller_mutation_rate=0.1")
    throttle, results = q.create_topics(b.bootstrap, "mutator", 7, [("mut-a", 3), ("mut-b", 1)])
    assert results == [("mut-a", 0, None),
                       ("mut-b", THROTTLING_QUOTA_EXCEEDED, None)], results
    # Two partitions owed at 0.1/s: 20 s, less the little time since.
    assert 10_000 < throttle <= 20_000, throttle
    assert q.create_topics(b.bootstrap, "bystander", 7, [("mut-c", 2)]) == (0, [("mut-c", 0, None)])
    throttle, results = q.create_topics(b.bootstrap, "mutator", 5, [("mut-d", 1)])
    assert results == [("mut-d", 0, None)] and throttle > 20_000, (throttle, results)
    if b.admin:
        families = scrape(b)
        assert sample(families, "keel_quota_throttled_total", quota="controller_mutation_rate") == 2
