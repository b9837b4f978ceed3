"""Cluster membership on a real etcd: brokers given the same
`keel.cluster.etcd.endpoints` see each other in Metadata and
DescribeCluster, agree on one controller elected through etcd and on one
cluster id; a broker that dies leaves after its session timeout (and the
controller moves), one that restarts on its data dir rejoins at once, and
a second broker claiming a node id, or a data dir of another cluster, is
refused. Keel's own (Apache Kafka has no etcd), so skipped under
KEEL_TEST_IMPL=kafka."""
from __future__ import annotations

import json
import signal
import urllib.request

import pytest
from confluent_kafka.admin import (AclBinding, AclBindingFilter, AclOperation, AclPermissionType,
                                  AdminClient, ResourcePatternType, ResourceType,
                                  ScramCredentialInfo, ScramMechanism, UserScramCredentialUpsertion)

import hardening_wire as hw
import kafka_tools
import kafka_wire as w
import quota_wire as q
from conftest import IMPL, Broker, _live_brokers, _started_by_test, wait_until

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="cluster mode over etcd is Keel's")

SESSION_MS = 2000
TIMEOUT_S = 15


def start_cluster(etcd, tmp_path, ids, prefix="/keel-test", extra=None):
    """Brokers `ids` of one cluster (with `extra` settings), each registered
    (its listeners accept before it has joined; its session is confirmed
    once it has)."""
    brokers = {}
    for node in ids:
        brokers[node] = member(etcd, tmp_path, node, prefix=prefix)
        brokers[node].sets.update(extra or {})
        brokers[node].start()
    for b in brokers.values():
        wait_until(lambda: not stats(b)["fenced"], TIMEOUT_S, f"{b.log_name} to register")
    return brokers


def member(etcd, tmp_path, node, prefix="/keel-test", data=None):
    """A broker of the cluster on `etcd`, not started; its log goes with a
    failing test's report."""
    base = tmp_path / f"b{node}"
    base.mkdir(parents=True, exist_ok=True)
    b = ClusterBroker(data or base / "data", base / f"broker-{node}.log", sets={
        "node.id": str(node),
        "keel.cluster.etcd.endpoints": etcd.endpoint,
        "keel.cluster.etcd.prefix": prefix,
        "keel.cluster.session.timeout.ms": str(SESSION_MS),
        # The object store the cluster's brokers share: a directory here.
        "keel.tier.remote": f"file://{tmp_path / 'objects'}",
    })
    b.log_name = f"broker {node}"
    _live_brokers.append(b)
    _started_by_test.append(b)
    return b


class ClusterBroker(Broker):
    def close(self) -> None:
        super().close()
        if self in _live_brokers:
            _live_brokers.remove(self)


def describe(b):
    """DescribeCluster through a new client, with a short timeout: librdkafka
    sends it to the controller it learnt from its first Metadata, so a
    client that learnt a dead one gives up and the caller asks afresh."""
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    return a.describe_cluster(request_timeout=3).result(5)


def view(b):
    """(node id -> port, controller id, cluster id) as `b` answers Metadata."""
    md = AdminClient({"bootstrap.servers": b.bootstrap}).list_topics(timeout=5)
    return {i: m.port for i, m in md.brokers.items()}, md.controller_id, md.cluster_id


def stats(b):
    with urllib.request.urlopen(f"http://{b.admin}/stats", timeout=5) as r:
        return json.load(r)["cluster"]


def test_brokers_list_each_other_and_agree_on_a_controller_and_cluster_id(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    ports = {node: b.port for node, b in brokers.items()}
    wait_until(lambda: all(view(b)[0] == ports for b in brokers.values()), TIMEOUT_S,
               "every broker to list all three")
    views = [view(b) for b in brokers.values()]
    assert len({v[1] for v in views}) == 1 and views[0][1] in ports, views
    assert len({v[2] for v in views}) == 1, views
    # DescribeCluster too, from each broker.
    for b in brokers.values():
        d = describe(b)
        assert {n.id: n.port for n in d.nodes} == ports
        assert (d.controller.id, d.cluster_id) == views[0][1:]
    s = stats(brokers[2])
    assert s["store"].startswith("etcd at ") and not s["fenced"] and s["broker_epoch"] > 0
    assert [m["node_id"] for m in s["brokers"]] == [1, 2, 3]
    # Apache Kafka's own tool lists every broker, asked at any one.
    done = kafka_tools.run("org.apache.kafka.tools.BrokerApiVersionsCommand",
                           "--bootstrap-server", brokers[3].bootstrap)
    assert done.returncode == 0, done.stderr[-3000:]
    for node, port in ports.items():
        assert f"127.0.0.1:{port} (id: {node} rack: null" in done.stdout, done.stdout[:3000]


def test_a_killed_controller_is_replaced_and_a_restarted_broker_rejoins_at_once(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2, 3])
    wait_until(lambda: len(view(brokers[1])[0]) == 3, TIMEOUT_S, "three brokers")
    controller = view(brokers[1])[1]
    others = [b for n, b in brokers.items() if n != controller]
    # How long this takes is bench/cluster_failover.py's to measure.
    brokers[controller].kill9()
    wait_until(lambda: all(controller not in view(b)[0] for b in others), TIMEOUT_S,
               "the killed broker to leave")
    # The others elect one new controller (each may see none for a
    # moment first).
    elected = lambda: {view(b)[1] for b in others}  # noqa: E731
    wait_until(lambda: len(elected()) == 1 and not elected() & {controller, -1}, TIMEOUT_S,
               "one new controller")
    # Restarted on its data dir, it replaces its own registration without
    # waiting for the old session to expire.
    brokers[controller].start()
    wait_until(lambda: all(len(view(b)[0]) == 3 for b in brokers.values()), TIMEOUT_S,
               "the restarted broker to rejoin")
    # A clean stop ends its session itself (it does not wait for the
    # lease to expire).
    leaving = others[0]
    leaving.stop()
    assert "left the cluster" in leaving.log_tail(), leaving.log_tail()
    rest = [b for b in brokers.values() if b is not leaving]
    wait_until(lambda: all(len(view(b)[0]) == 2 for b in rest), TIMEOUT_S, "a clean leave")


def refused(b, message):
    """Starts `b` and waits for it to exit with an error saying `message`
    (its listeners are bound before it joins, so it may accept first)."""
    try:
        b.start()
    except AssertionError:
        pass
    wait_until(lambda: not b.alive(), TIMEOUT_S, "the broker to give up")
    assert b.proc.returncode != 0
    assert message in b.log_tail(), b.log_tail()


def test_a_taken_node_id_and_another_clusters_data_dir_are_refused(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1])
    # Refused once the holder's session has had time to expire.
    refused(member(etcd, tmp_path / "impostor", 1), "node.id=1 is registered by another live broker")
    assert len(view(brokers[1])[0]) == 1 and not stats(brokers[1])["fenced"]
    # A one-node broker's data dir carries its own cluster id.
    alone = Broker(tmp_path / "alone" / "data", tmp_path / "alone" / "broker.log")
    alone.start()
    alone.stop()
    refused(member(etcd, tmp_path, 5, data=tmp_path / "alone" / "data"),
            "the data directory belongs to cluster")


def test_a_broker_that_loses_etcd_fences_itself_and_recovers(etcd, tmp_path):
    brokers = start_cluster(etcd, tmp_path, [1, 2])
    etcd.stop()
    wait_until(lambda: stats(brokers[1])["fenced"] and stats(brokers[2])["fenced"],
               TIMEOUT_S, "both brokers to count themselves fenced")
    # Still answering clients meanwhile.
    assert 1 in view(brokers[2])[0]
    etcd.start()
    wait_until(lambda: not any(stats(b)["fenced"] for b in brokers.values()), TIMEOUT_S * 2,
               "sessions confirmed again")
    wait_until(lambda: all(len(view(b)[0]) == 2 for b in brokers.values()), TIMEOUT_S,
               "both brokers listed again")


def producer_ids(b, n):
    with w.Conn(b.bootstrap) as conn:
        out = []
        for _ in range(n):
            err, pid, epoch = hw.init_producer_id(conn)
            assert (err, epoch) == (0, 0)
            out.append(pid)
        return out


def test_brokers_never_hand_out_the_same_producer_id(etcd, tmp_path):
    """Producer ids come in blocks from one counter in etcd: a producer id
    from one broker is not another producer's on another broker (which
    would merge their sequences), across restarts too. A directory that
    handed out ids alone before joining starts above them."""
    alone = member(etcd, tmp_path, 3)
    alone.sets = {k: v for k, v in alone.sets.items() if not k.startswith("keel.cluster.")}
    alone.start()
    before = producer_ids(alone, 5)
    alone.stop()
    brokers = start_cluster(etcd, tmp_path, [1, 2])
    seen = producer_ids(brokers[1], 3) + producer_ids(brokers[2], 3)
    brokers[1].kill9()
    brokers[1].start()
    wait_until(lambda: not stats(brokers[1])["fenced"], TIMEOUT_S, "broker 1 to rejoin")
    seen += producer_ids(brokers[1], 3) + producer_ids(brokers[2], 3)
    assert len(set(seen)) == len(seen), seen
    # The lone directory joins a cluster of its own (the same etcd, another
    # prefix): its cluster's first block starts above what it handed out.
    joined = member(etcd, tmp_path, 3, prefix="/keel-other")
    joined.data_dir = alone.data_dir
    try:
        joined.start()
        wait_until(lambda: not stats(joined)["fenced"], TIMEOUT_S, "the lone directory to join")
        assert min(producer_ids(joined, 3)) > max(before)
    finally:
        joined.close()


def test_a_stopped_broker_is_dropped_and_comes_back_fenced_in_a_new_epoch(etcd, tmp_path):
    """A zombie: the controller is stopped (SIGSTOP) past its session
    timeout. The other broker drops it and takes over as controller; when
    it runs again (SIGCONT) it finds its session ended, counts itself
    fenced, and registers anew in a new broker epoch, leaving the new
    controller in place."""
    brokers = start_cluster(etcd, tmp_path, [1, 2])
    controller = view(brokers[1])[1]
    other = 2 if controller == 1 else 1
    zombie, survivor = brokers[controller], brokers[other]
    epoch = stats(zombie)["broker_epoch"]
    zombie.proc.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: view(survivor)[0].keys() == {other}, TIMEOUT_S, "the zombie to be dropped")
        wait_until(lambda: view(survivor)[1] == other, TIMEOUT_S, "a new controller")
    finally:
        zombie.proc.send_signal(signal.SIGCONT)
    wait_until(lambda: stats(zombie)["broker_epoch"] > epoch and not stats(zombie)["fenced"],
               TIMEOUT_S, "the zombie to register anew")
    assert "fenced: the session may have ended" in zombie.log_tail()
    wait_until(lambda: all(view(b)[0].keys() == {1, 2} for b in brokers.values()), TIMEOUT_S,
               "both brokers listed again")
    assert {view(b)[1] for b in brokers.values()} == {other}, "the new controller stays"


def acls(b) -> set[tuple[str, str, str]]:
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    everything = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None,
                                  AclOperation.ANY, AclPermissionType.ANY)
    found = a.describe_acls(everything, request_timeout=5).result(10)
    return {(x.name, x.principal, x.operation.name) for x in found}


def scram_users(b) -> set[str]:
    a = AdminClient({"bootstrap.servers": b.bootstrap})
    return set(a.describe_user_scram_credentials(request_timeout=5).result(10))


def test_acls_credentials_and_quotas_are_the_clusters(etcd, tmp_path):
    """ACLs, SCRAM credentials and client quotas live in etcd: a change at
    one broker is seen at every broker, and survives a restart."""
    brokers = start_cluster(etcd, tmp_path, [1, 2], extra={
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": "User:ANONYMOUS",
    })
    one, two = brokers[1], brokers[2]
    admin = AdminClient({"bootstrap.servers": one.bootstrap})
    binding = AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice",
                         "*", AclOperation.READ, AclPermissionType.ALLOW)
    admin.create_acls([binding], request_timeout=5)[binding].result(10)
    credential = UserScramCredentialUpsertion(
        "alice", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096), b"secret")
    admin.alter_user_scram_credentials([credential], request_timeout=5)["alice"].result(10)
    assert q.alter(one.bootstrap, [([("user", "alice")], [("producer_byte_rate", 1024.0, False)])]) \
        == [(0, None, [("user", "alice")])]

    def quotas(b):
        return q.describe(b.bootstrap, [("user", q.EXACT, "alice")], strict=True)[2]
    alice = [([("user", "alice")], {"producer_byte_rate": 1024.0})]
    wait_until(lambda: acls(two) == {("orders", "User:alice", "READ")} and scram_users(two) == {"alice"}
               and quotas(two) == alice, TIMEOUT_S, "broker 2 to see broker 1's changes")
    # Changed at broker 2, seen at broker 1; and a restart reads them again.
    orders = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, None, None,
                              AclOperation.ANY, AclPermissionType.ANY)
    admin_two = AdminClient({"bootstrap.servers": two.bootstrap})
    deleted = admin_two.delete_acls([orders], request_timeout=5)
    assert len(deleted[orders].result(10)) == 1
    assert acls(two) == set()
    wait_until(lambda: acls(one) == set(), TIMEOUT_S, "the deletion at broker 1")
    one.kill9()
    one.start()
    wait_until(lambda: not stats(one)["fenced"], TIMEOUT_S, "broker 1 to rejoin")
    assert acls(one) == set() and scram_users(one) == {"alice"} and quotas(one) == alice
