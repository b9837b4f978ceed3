"""ACLs with Kafka's StandardAuthorizer keys: a SASL user without ACLs is
denied a produce, a fetch, a group and a topic creation with Kafka's
error codes, and its topics are hidden from Metadata; `kafka-acls --add`
lets it in, `--list` shows the ACLs, they survive kill -9, and `--remove`
shuts it out again. Every decision is in the authorizer's log lines."""
from __future__ import annotations

import re
import subprocess
import time

import pytest
from confluent_kafka import (Consumer, ConsumerGroupTopicPartitions, KafkaError, KafkaException, Producer,
                             TopicPartition)
from confluent_kafka.admin import (AclBindingFilter, AclOperation, AclPermissionType, AdminClient, ConfigResource,
                                   NewPartitions, NewTopic, ResourcePatternType, ResourceType)

import kafka_tools
from conftest import IMPL, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic
from test_java_transactions import java
from test_operator_tools import kafka_acls, kafka_configs
from test_transaction_tools import transactions
from test_sasl import SaslBroker, jaas, sasl

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's listener flags")

USERS = {"admin": "admin-secret", "alice": "alice-secret", "bob": "bob-secret"}
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"


@pytest.fixture
def acl_broker(tmp_path_factory):
    made = []

    def make(extra: dict[str, str] | None = None) -> SaslBroker:
        sets = {
            "sasl.enabled.mechanisms": "PLAIN",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(USERS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas(USERS),
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_PLAINTEXT",
            "authorizer.class.name": AUTHORIZER,
            # The test's own PLAINTEXT calls come in as User:ANONYMOUS.
            "super.users": "User:admin;User:ANONYMOUS",
        }
        sets.update(extra or {})
        base = tmp_path_factory.mktemp("keel-acls")
        b = SaslBroker(base / "data", base / "broker.log", sets)
        made.append(b)
        b.start()
        return b
    yield make
    for b in made:
        b.close()


def as_user(user: str) -> dict:
    return sasl("PLAIN", user, USERS[user])


def produce_error(bootstrap: str, topic: str, user: str) -> KafkaError | None:
    """Produces one record as `user`: -> its delivery error, if any."""
    delivered = []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 5000, **as_user(user)})
    p.produce(topic, value=b"x", on_delivery=lambda e, m: delivered.append(e))
    p.flush(15)
    assert len(delivered) == 1
    return delivered[0]


def consume_error(bootstrap: str, topic: str, group: str, user: str) -> tuple[KafkaError | None, list[bytes]]:
    """Subscribes as `user`: -> the first error the consumer reports, or
    the records it read (until one arrives or 10 s pass)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                  **as_user(user)})
    c.subscribe([topic])
    got: list[bytes] = []
    error = None
    deadline = time.monotonic() + 10
    try:
        while time.monotonic() < deadline and not got and error is None:
            for m in c.consume(10, timeout=0.5):
                if m.error():
                    error = m.error()
                    break
                got.append(m.value())
    finally:
        c.close()
    return error, got


def create_error(bootstrap: str, topic: str, user: str) -> KafkaError | None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **as_user(user)})
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(timeout=CLIENT_TIMEOUT_S)
    except KafkaException as e:
        return e.args[0]
    return None


def visible_topics(bootstrap: str, user: str) -> set[str]:
    md = AdminClient({"bootstrap.servers": bootstrap, **as_user(user)}).list_topics(timeout=CLIENT_TIMEOUT_S)
    return set(md.topics)


def listed_groups(bootstrap: str, user: str) -> set[str]:
    admin = AdminClient({"bootstrap.servers": bootstrap, **as_user(user)})
    return {g.group_id for g in admin.list_consumer_groups().result(timeout=CLIENT_TIMEOUT_S).valid}


def test_a_user_without_acls_is_denied_until_kafka_acls_adds_them(acl_broker, tmp_path):
    b = acl_broker()
    create_topic(b.bootstrap, "orders", partitions=2)
    sasl_bs = b.sasl_bootstrap
    # No ACLs: alice may not produce, consume, join a group or create a
    # topic, and does not see the topic.
    assert produce_error(sasl_bs, "orders", "alice").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    error, got = consume_error(sasl_bs, "orders", "g-orders", "alice")
    assert not got and error is not None and error.code() in (
        KafkaError.GROUP_AUTHORIZATION_FAILED, KafkaError.TOPIC_AUTHORIZATION_FAILED), error
    assert create_error(sasl_bs, "alice-new", "alice").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "orders" not in visible_topics(sasl_bs, "alice")
    wait_until(lambda: "Principal = User:alice is Denied operation = DESCRIBE from host = 127.0.0.1 on "
               "resource = Topic:LITERAL:orders" in b.log_tail(), 10, "the denial in the authorizer's log")
    # kafka-acls adds her rights: write and read the topic, use the group,
    # create topics under a prefix.
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Write",
               "--operation", "Read", "--topic", "orders")
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "g-orders")
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Create",
               "--topic", "alice-", "--resource-pattern-type", "prefixed")
    assert produce_error(sasl_bs, "orders", "alice") is None
    error, got = consume_error(sasl_bs, "orders", "g-orders", "alice")
    assert error is None and got == [b"x"], (error, got)
    assert create_error(sasl_bs, "alice-new", "alice") is None
    assert "orders" in visible_topics(sasl_bs, "alice")
    # bob has none of it, and does not see alice's group.
    assert produce_error(sasl_bs, "orders", "bob").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert "g-orders" in listed_groups(sasl_bs, "alice")
    assert "g-orders" not in listed_groups(sasl_bs, "bob")
    # Users and their credentials are the cluster's: alice may not list them.
    alice_config = tmp_path / "alice.properties"
    alice_config.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                            "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                            'username="alice" password="alice-secret";\n')
    done = kafka_configs(sasl_bs, "--command-config", str(alice_config), "--describe", "--entity-type", "users",
                         ok=False)
    assert done.returncode != 0 and "ClusterAuthorizationException" in done.stdout + done.stderr, \
        done.stdout[-2000:] + done.stderr[-2000:]
    # --list shows the ACLs, and they survive kill -9.
    listed = kafka_acls(b.bootstrap, "--list", "--principal", "User:alice").stdout
    assert "ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)" in listed, listed
    assert "ResourcePattern(resourceType=TOPIC, name=alice-, patternType=PREFIXED)" in listed, listed
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in listed, listed
    before = sorted(kafka_acls(b.bootstrap, "--list").stdout.splitlines())
    b.kill9()
    b.start()
    assert sorted(kafka_acls(b.bootstrap, "--list").stdout.splitlines()) == before
    assert produce_error(sasl_bs, "orders", "alice") is None
    # --remove shuts her out again.
    kafka_acls(b.bootstrap, "--remove", "--force", "--allow-principal", "User:alice", "--operation", "Write",
               "--topic", "orders")
    assert produce_error(sasl_bs, "orders", "alice").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    wait_until(lambda: "Principal = User:alice is Denied operation = WRITE" in b.log_tail(), 10,
               "the denied write in the log")
    # Reading is still hers.
    assert "orders" in visible_topics(sasl_bs, "alice")


def test_deny_acls_and_super_users(acl_broker):
    b = acl_broker()
    create_topic(b.bootstrap, "shared", partitions=1)
    admin = AdminClient({"bootstrap.servers": b.bootstrap})
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:*", "--operation", "All", "--topic", "shared")
    kafka_acls(b.bootstrap, "--add", "--deny-principal", "User:bob", "--operation", "Write", "--topic", "shared")
    assert produce_error(b.sasl_bootstrap, "shared", "alice") is None
    assert produce_error(b.sasl_bootstrap, "shared", "bob").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    # A super user needs no ACL.
    assert produce_error(b.sasl_bootstrap, "shared", "admin") is None
    # The admin API sees the same ACLs.
    bindings = admin.describe_acls(AclBindingFilter(ResourceType.TOPIC, "shared", ResourcePatternType.LITERAL,
                                                    None, None, AclOperation.ANY, AclPermissionType.ANY)
                                   ).result(timeout=CLIENT_TIMEOUT_S)
    assert sorted((x.principal, x.operation, x.permission_type) for x in bindings) == sorted([
        ("User:*", AclOperation.ALL, AclPermissionType.ALLOW),
        ("User:bob", AclOperation.WRITE, AclPermissionType.DENY)])
    # Configs: DESCRIBE_CONFIGS on the topic; a topic no ACL names is
    # refused with TOPIC_AUTHORIZATION_FAILED.
    create_topic(b.bootstrap, "private", partitions=1)
    user_admin = AdminClient({"bootstrap.servers": b.sasl_bootstrap, **as_user("alice")})
    [shared] = user_admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "shared")]).values()
    assert "retention.ms" in shared.result(timeout=CLIENT_TIMEOUT_S)
    [private] = user_admin.describe_configs([ConfigResource(ConfigResource.Type.TOPIC, "private")]).values()
    with pytest.raises(KafkaException) as e:
        private.result(timeout=CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value
    # CreatePartitions: ALTER on the topic (ALL implies it).
    [grown] = user_admin.create_partitions([NewPartitions("shared", 2)], request_timeout=10).values()
    grown.result()
    [refused] = user_admin.create_partitions([NewPartitions("private", 2)], request_timeout=10).values()
    with pytest.raises(KafkaException) as e:
        refused.result()
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value


def txn_producer(bootstrap: str, txn_id: str, user: str | None) -> Producer:
    creds = as_user(user) if user else {}
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": txn_id, "linger.ms": 0, **creds})


def command_config(tmp_path, user: str) -> str:
    """A Kafka tool's --command-config logging in as `user` with PLAIN."""
    path = tmp_path / f"{user}.properties"
    path.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                    "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                    f'username="{user}" password="{USERS[user]}";\n')
    return str(path)


def test_transactions_and_admin_apis_check_acls(acl_broker, tmp_path):
    """The transaction APIs want WRITE on the transactional id (and READ on
    the group whose offsets a transaction commits); listing and describing
    transactions want DESCRIBE on the id; DeleteRecords wants DELETE on the
    topic, DescribeLogDirs DESCRIBE on the cluster."""
    b = acl_broker()
    create_topic(b.bootstrap, "ledger", partitions=1)
    bs = b.sasl_bootstrap
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Write",
               "--operation", "Read", "--topic", "ledger")
    # Without WRITE on her transactional id, InitProducerId is refused.
    p = txn_producer(bs, "tx-alice", "alice")
    with pytest.raises(KafkaException) as e:
        p.init_transactions(CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, e.value
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Write",
               "--transactional-id", "tx-alice")
    p = txn_producer(bs, "tx-alice", "alice")
    p.init_transactions(CLIENT_TIMEOUT_S)
    group = Consumer({"bootstrap.servers": bs, "group.id": "g-ledger", **as_user("alice")})
    # AddOffsetsToTxn without READ on the group: refused, and the
    # transaction aborts.
    p.begin_transaction()
    p.produce("ledger", value=b"aborted", partition=0)
    with pytest.raises(KafkaException) as e:
        p.send_offsets_to_transaction([TopicPartition("ledger", 0, 1)], group.consumer_group_metadata(),
                                      CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED, e.value
    p.abort_transaction(CLIENT_TIMEOUT_S)
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "g-ledger")
    p.begin_transaction()
    p.produce("ledger", value=b"committed", partition=0)
    p.send_offsets_to_transaction([TopicPartition("ledger", 0, 1)], group.consumer_group_metadata(),
                                  CLIENT_TIMEOUT_S)
    p.commit_transaction(CLIENT_TIMEOUT_S)
    group.close()
    super_admin = AdminClient({"bootstrap.servers": b.bootstrap})
    committed = super_admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions("g-ledger")])["g-ledger"].result(timeout=CLIENT_TIMEOUT_S)
    assert [(t.topic, t.offset) for t in committed.topic_partitions] == [("ledger", 1)]
    # A super user's transaction is hidden from alice's listing, and she
    # may not describe it.
    admin_txn = txn_producer(b.bootstrap, "tx-admin", None)
    admin_txn.init_transactions(CLIENT_TIMEOUT_S)
    admin_txn.begin_transaction()
    admin_txn.produce("ledger", value=b"admin", partition=0)
    admin_txn.commit_transaction(CLIENT_TIMEOUT_S)
    alice = command_config(tmp_path, "alice")
    _, listed, _ = transactions(b.bootstrap, "list")
    assert {r["TransactionalId"] for r in listed} == {"tx-alice", "tx-admin"}, listed
    _, listed, _ = transactions(bs, "--command-config", alice, "list")
    assert {r["TransactionalId"] for r in listed} == {"tx-alice"}, listed
    code, _, out = transactions(bs, "--command-config", alice, "describe", "--transactional-id", "tx-admin",
                                ok=False)
    # (Refused at FindCoordinator already, which wants DESCRIBE on the id too.)
    assert code != 0 and "failed due to authorization failure" in out, out[-2000:]
    # DeleteRecords needs DELETE on the topic.
    user_admin = AdminClient({"bootstrap.servers": bs, **as_user("alice")})
    [deleted] = user_admin.delete_records([TopicPartition("ledger", 0, 1)]).values()
    with pytest.raises(KafkaException) as e:
        deleted.result(timeout=CLIENT_TIMEOUT_S)
    assert e.value.args[0].code() == KafkaError.TOPIC_AUTHORIZATION_FAILED, e.value
    # DescribeLogDirs needs DESCRIBE on the cluster.
    done = kafka_tools.run("org.apache.kafka.tools.LogDirsCommand", "--bootstrap-server", bs,
                           "--command-config", alice, "--describe")
    assert done.returncode != 0 and "ClusterAuthorizationException" in done.stdout + done.stderr, \
        done.stdout[-2000:] + done.stderr[-2000:]


def test_acl_apis_say_security_disabled_without_an_authorizer(broker_factory):
    b = broker_factory({})
    done = kafka_acls(b.bootstrap, "--list", ok=False)
    assert done.returncode != 0 and "SecurityDisabledException" in done.stdout + done.stderr, done.stdout[-2000:]


def share_poll(bootstrap: str, topic: str, group: str, properties: str) -> str:
    """One share consumer (Kafka's Java client) with a tool's properties:
    -> GOT <n>, ERROR <exception class> or NONE."""
    done = subprocess.run(java("ShareConsume.java", "poll", bootstrap, topic, group, properties, "20"),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.strip().splitlines()[-1]


def share_groups(bootstrap: str, properties: str, *args: str):
    return kafka_tools.run("org.apache.kafka.tools.consumer.group.ShareGroupCommand", "--bootstrap-server",
                           bootstrap, "--command-config", properties, *args)


def test_share_groups_check_acls(acl_broker, tmp_path):
    """Share groups as Kafka checks them: a share consumer needs DESCRIBE
    on its topic, READ on its group, then READ on the topic; describing the group's offsets needs
    DESCRIBE on the group, and deleting them DELETE on it."""
    b = acl_broker()
    bs = b.sasl_bootstrap
    create_topic(b.bootstrap, "jobs", partitions=1)
    p = Producer({"bootstrap.servers": b.bootstrap})
    for i in range(5):
        p.produce("jobs", value=str(i).encode())
    assert p.flush(15) == 0
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "groups", "--entity-name", "workers",
                  "--add-config", "share.auto.offset.reset=earliest")
    alice, bob = command_config(tmp_path, "alice"), command_config(tmp_path, "bob")
    # Without ACLs the client's Metadata already fails on the topic.
    assert share_poll(bs, "jobs", "workers", alice) == "ERROR TopicAuthorizationException"
    # DESCRIBE on the topic: the heartbeat wants READ on the group.
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Describe", "--topic", "jobs")
    assert share_poll(bs, "jobs", "workers", alice) == "ERROR GroupAuthorizationException"
    # READ on the group: the member joins, and ShareFetch wants READ on
    # the topic.
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--group", "workers")
    assert share_poll(bs, "jobs", "workers", alice) == "ERROR TopicAuthorizationException"
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Read", "--topic", "jobs")
    assert share_poll(bs, "jobs", "workers", alice) == "GOT 5"
    # Bob may not see the group's offsets; alice, with READ (which
    # implies DESCRIBE) on the group and the topic, may.
    denied = share_groups(bs, bob, "--describe", "--group", "workers")
    assert "GroupAuthorizationException" in denied.stdout + denied.stderr, denied.stdout + denied.stderr[-2000:]
    # With DESCRIBE on the group but not on the topic, the topic is left
    # out of the offsets, as Kafka leaves it.
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:bob", "--operation", "Describe", "--group", "workers")
    hidden = share_groups(bs, bob, "--describe", "--group", "workers")
    assert hidden.returncode == 0 and "no offset information" in hidden.stdout, \
        hidden.stdout + hidden.stderr[-2000:]
    described = share_groups(bs, alice, "--describe", "--group", "workers")
    assert described.returncode == 0 and re.search(r"workers\s+jobs\s+0\s+\d+", described.stdout), \
        described.stdout + described.stderr[-2000:]
    # Deleting the offsets needs DELETE on the group.
    refused = share_groups(bs, alice, "--delete-offsets", "--group", "workers", "--topic", "jobs")
    assert re.search(r"jobs\s+Error: Group authorization failed", refused.stdout), \
        refused.stdout + refused.stderr[-2000:]
    kafka_acls(b.bootstrap, "--add", "--allow-principal", "User:alice", "--operation", "Delete", "--group",
               "workers")
    deleted = share_groups(bs, alice, "--delete-offsets", "--group", "workers", "--topic", "jobs")
    assert re.search(r"jobs\s+Successful", deleted.stdout), deleted.stdout + deleted.stderr[-2000:]
