"""SASL with Kafka's keys: PLAIN users from the listener's JAAS config,
SCRAM-SHA-256/512 credentials set with `kafka-configs` (and the admin
API) and kept across a kill -9; confluent-kafka, kafka-python and Apache
Kafka's console clients over SASL_PLAINTEXT and SASL_SSL; wrong passwords
and unknown users refused with SASL_AUTHENTICATION_FAILED after Kafka's
delay; sessions that re-authenticate (KIP-368) and ones that expire;
hostile handshakes closed cleanly. Certificates are made by the test."""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
import socket
import subprocess
import time
import urllib.request

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import (AdminClient, ScramCredentialInfo, ScramMechanism, UserScramCredentialDeletion,
                                  UserScramCredentialUpsertion)
from kafka import KafkaConsumer, KafkaProducer

import kafka_tools
import kafka_wire as w
from conftest import IMPL, Broker, free_port, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic, round_trip
from pki import Pki
from test_operator_tools import kafka_configs

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's listener flags")

SASL_HANDSHAKE, SASL_AUTHENTICATE = 17, 36
SASL_AUTHENTICATION_FAILED, ILLEGAL_SASL_STATE, UNSUPPORTED_SASL_MECHANISM = 58, 34, 33
PLAIN_USERS = {"alice": "alice-secret", "admin": "admin-secret"}


def jaas(users: dict[str, str]) -> str:
    options = " ".join(f'user_{u}="{p}"' for u, p in users.items())
    return f"org.apache.kafka.common.security.plain.PlainLoginModule required {options};"


class SaslBroker(Broker):
    """Keel with a PLAINTEXT listener on `port` (for the test's own admin
    calls), a SASL_PLAINTEXT one on `sasl_port` and a SASL_SSL one on
    `sasl_ssl_port`."""

    def __init__(self, data_dir, log_path, sets):
        super().__init__(data_dir, log_path, sets=sets)
        taken = {self.port}
        self.sasl_port = self._port(taken)
        self.sasl_ssl_port = self._port(taken)
        self.sets["listeners"] = (f"PLAINTEXT://127.0.0.1:{self.port},SASL_PLAINTEXT://127.0.0.1:{self.sasl_port},"
                                  f"SASL_SSL://127.0.0.1:{self.sasl_ssl_port}")
        self.sets["advertised.listeners"] = self.sets["listeners"]

    @staticmethod
    def _port(taken: set[int]) -> int:
        port = free_port()
        while port in taken:
            port = free_port()
        taken.add(port)
        return port

    @property
    def sasl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_port}"

    @property
    def sasl_ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.sasl_ssl_port}"


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path)


@pytest.fixture
def sasl_broker(tmp_path_factory, pki):
    made = []

    def make(extra: dict[str, str] | None = None, start: bool = True) -> SaslBroker:
        pki.leaf("broker", server=True)
        sets = {
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.dir / "broker.pem"),
            "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512",
            "listener.name.sasl_plaintext.plain.sasl.jaas.config": jaas(PLAIN_USERS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": jaas(PLAIN_USERS),
        }
        sets.update(extra or {})
        base = tmp_path_factory.mktemp("keel-sasl")
        b = SaslBroker(base / "data", base / "broker.log", sets)
        made.append(b)
        if start:
            b.start()
        return b
    yield make
    for b in made:
        b.close()


def sasl(mechanism: str, user: str, password: str, pki: Pki | None = None) -> dict:
    c = {"security.protocol": "SASL_SSL" if pki else "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
         "sasl.username": user, "sasl.password": password}
    if pki:
        c["ssl.ca.location"] = pki.ca
    return c


def add_scram(bootstrap: str, user: str, password: str, mechanism=ScramMechanism.SCRAM_SHA_512,
              iterations: int = 8192) -> None:
    """AlterUserScramCredentials through confluent-kafka's admin client."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    upsert = UserScramCredentialUpsertion(user, ScramCredentialInfo(mechanism, iterations), password.encode())
    for f in admin.alter_user_scram_credentials([upsert]).values():
        f.result(timeout=CLIENT_TIMEOUT_S)


def delete_scram(bootstrap: str, user: str, mechanism=ScramMechanism.SCRAM_SHA_512) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for f in admin.alter_user_scram_credentials([UserScramCredentialDeletion(user, mechanism)]).values():
        f.result(timeout=CLIENT_TIMEOUT_S)


def metric(b: Broker, prefix: str) -> float:
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=10) as r:
        lines = [l for l in r.read().decode().splitlines() if l.startswith(prefix)]
    return sum(float(l.split()[-1]) for l in lines)


def refused(bootstrap: str, extra: dict) -> list[str]:
    """Produces once with `extra`: -> the client's errors; the record must
    not be delivered."""
    errors, delivered = [], []
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 4000,
                  "error_cb": lambda e: errors.append(str(e)), **extra})
    p.produce("guarded", value=b"x", on_delivery=lambda e, m: delivered.append(e))
    p.flush(10)
    assert len(delivered) == 1 and delivered[0] is not None, "a client that did not authenticate must not produce"
    return errors


def test_plain_and_scram_over_sasl_plaintext_and_sasl_ssl_with_real_clients(sasl_broker, pki):
    b = sasl_broker()
    create_topic(b.bootstrap, "guarded", partitions=2)
    add_scram(b.bootstrap, "carol", "carol-512")
    add_scram(b.bootstrap, "carol", "carol-256", ScramMechanism.SCRAM_SHA_256, iterations=4096)
    expected = sorted(f"v{i}".encode() for i in range(100))
    for k, extra in enumerate([sasl("PLAIN", "alice", "alice-secret"),
                               sasl("SCRAM-SHA-512", "carol", "carol-512", pki),
                               sasl("SCRAM-SHA-256", "carol", "carol-256"),
                               sasl("PLAIN", "admin", "admin-secret", pki)]):
        topic = f"guarded-{k}"
        create_topic(b.bootstrap, topic, partitions=2)
        bootstrap = b.sasl_ssl_bootstrap if "ssl.ca.location" in extra else b.sasl_bootstrap
        assert sorted(round_trip(bootstrap, topic, extra, n=100)) == expected, extra["sasl.mechanism"]
    # kafka-python: PLAIN over SASL_PLAINTEXT, SCRAM-SHA-512 over SASL_SSL.
    for bootstrap, kw in [
        (b.sasl_bootstrap, dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                                sasl_plain_username="alice", sasl_plain_password="alice-secret")),
        (b.sasl_ssl_bootstrap, dict(security_protocol="SASL_SSL", ssl_cafile=pki.ca, sasl_mechanism="SCRAM-SHA-512",
                                    sasl_plain_username="carol", sasl_plain_password="carol-512")),
    ]:
        producer = KafkaProducer(bootstrap_servers=bootstrap, **kw)
        for i in range(20):
            producer.send("guarded", value=f"kp-{kw['sasl_mechanism']}-{i}".encode())
        producer.flush(CLIENT_TIMEOUT_S)
        producer.close()
        consumer = KafkaConsumer("guarded", bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                 consumer_timeout_ms=10_000, **kw)
        values = {m.value for m in consumer}
        consumer.close()
        assert {f"kp-{kw['sasl_mechanism']}-{i}".encode() for i in range(20)} <= values
    # Every success is counted by listener and mechanism.
    for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]:
        assert metric(b, f'keel_sasl_authentications_total{{listener="SASL_PLAINTEXT",mechanism="{mechanism}"}}') \
            + metric(b, f'keel_sasl_authentications_total{{listener="SASL_SSL",mechanism="{mechanism}"}}') >= 1


def test_wrong_passwords_and_unknown_users_are_refused_after_the_delay(sasl_broker, pki):
    b = sasl_broker({"connection.failed.authentication.delay.ms": "700"})
    create_topic(b.bootstrap, "guarded", partitions=1)
    add_scram(b.bootstrap, "carol", "carol-512")
    for extra in [sasl("PLAIN", "alice", "not-alices-password"),
                  sasl("PLAIN", "mallory", "alice-secret"),
                  sasl("SCRAM-SHA-512", "carol", "not-carols-password", pki),
                  sasl("SCRAM-SHA-512", "mallory", "carol-512", pki),
                  sasl("SCRAM-SHA-256", "carol", "carol-512")]:
        errors = refused(b.sasl_ssl_bootstrap if "ssl.ca.location" in extra else b.sasl_bootstrap, extra)
        assert any("Authentication failed" in e or "SASL authentication error" in e for e in errors), errors
    wait_until(lambda: b.log_tail().count("SASL authentication failed") >= 5, 10, "the refusals in the log")
    # The broker's own lines (not the test's note of the command line).
    log = "\n".join(l for l in b.log_tail().splitlines() if not l.startswith("====="))
    for secret in ["not-alices-password", "not-carols-password", "alice-secret", "carol-512"]:
        assert secret not in log, f"{secret} is in the log"
    assert metric(b, "keel_authentication_failures_total") >= 5
    # Kafka's delay: the failure comes no sooner than
    # connection.failed.authentication.delay.ms after the exchange.
    conn = w.Conn(b.sasl_bootstrap)
    assert handshake(conn, "PLAIN") == (0, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    started = time.monotonic()
    error, message, _, _ = authenticate(conn, b"\0alice\0wrong")
    assert time.monotonic() - started >= 0.7
    assert error == SASL_AUTHENTICATION_FAILED and message == "Authentication failed: Invalid username or password"
    assert conn.closed_by_peer()
    # The right password still works.
    assert len(round_trip(b.sasl_bootstrap, "guarded", sasl("PLAIN", "alice", "alice-secret"), n=5)) >= 5


def test_kafka_configs_manages_scram_credentials_that_survive_a_kill(sasl_broker, pki, tmp_path):
    """`kafka-configs --alter --add-config 'SCRAM-SHA-512=[...]'`, then
    Apache Kafka's console producer and consumer with a SASL_SSL client
    config; the credential survives kill -9; deleting it locks the user
    out."""
    b = sasl_broker()
    create_topic(b.bootstrap, "java-sasl", partitions=2)
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "users", "--entity-name", "dora",
                  "--add-config", "SCRAM-SHA-512=[iterations=8192,password=dora-secret],SCRAM-SHA-256=[password=x]")
    described = kafka_configs(b.bootstrap, "--describe", "--entity-type", "users", "--entity-name", "dora").stdout
    assert "SCRAM-SHA-256=iterations=4096" in described and "SCRAM-SHA-512=iterations=8192" in described, described
    # Kafka's rules, checked by the broker too (kafka-configs checks this
    # one itself; librdkafka sends it): too few iterations is
    # UNACCEPTABLE_CREDENTIAL.
    with pytest.raises(KafkaException, match="Too few iterations"):
        add_scram(b.bootstrap, "dora", "weak", iterations=100)
    b.kill9()
    b.start()
    assert "SCRAM-SHA-512=iterations=8192" in kafka_configs(
        b.bootstrap, "--describe", "--entity-type", "users", "--entity-name", "dora").stdout
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                      "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                      'username="dora" password="dora-secret";\n'
                      f"ssl.truststore.type=PEM\nssl.truststore.location={pki.ca}\n")
    java = ["java", "-Xmx256m", "-cp", kafka_tools.classpath(), f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}"]
    lines = [f"line-{i}" for i in range(20)]
    produced = subprocess.run(java + ["org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server",
                                      b.sasl_ssl_bootstrap, "--topic", "java-sasl", "--command-config", str(config)],
                              input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stderr[-3000:]
    consumed = subprocess.run(java + ["org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                                      b.sasl_ssl_bootstrap, "--topic", "java-sasl", "--from-beginning",
                                      "--max-messages", str(len(lines)), "--timeout-ms", "30000",
                                      "--command-config", str(config)],
                              capture_output=True, text=True, timeout=120)
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    assert sorted(consumed.stdout.split()) == sorted(lines), consumed.stdout
    # Deleted: dora can no longer log in.
    kafka_configs(b.bootstrap, "--alter", "--entity-type", "users", "--entity-name", "dora",
                  "--delete-config", "SCRAM-SHA-512")
    described = kafka_configs(b.bootstrap, "--describe", "--entity-type", "users", "--entity-name", "dora").stdout
    assert "SCRAM-SHA-512" not in described and "SCRAM-SHA-256" in described, described
    create_topic(b.bootstrap, "guarded", partitions=1)
    refused(b.sasl_ssl_bootstrap, sasl("SCRAM-SHA-512", "dora", "dora-secret", pki))


def test_sessions_re_authenticate_within_connections_max_reauth_ms(sasl_broker):
    b = sasl_broker({"connections.max.reauth.ms": "2000"})
    create_topic(b.bootstrap, "reauth", partitions=1)
    extra = sasl("PLAIN", "alice", "alice-secret")
    p = Producer({"bootstrap.servers": b.sasl_bootstrap, **extra})
    c = Consumer({"bootstrap.servers": b.sasl_bootstrap, "group.id": "reauth", "auto.offset.reset": "earliest",
                  **extra})
    c.subscribe(["reauth"])
    got = []
    try:
        # Seven seconds of traffic: every connection outlives its session
        # several times, and re-authenticates each time.
        deadline = time.monotonic() + 7
        i = 0
        while time.monotonic() < deadline:
            p.produce("reauth", value=f"r{i}".encode())
            i += 1
            p.poll(0)
            got.extend(m.value() for m in c.consume(100, timeout=0.1) if not m.error())
        assert p.flush(CLIENT_TIMEOUT_S) == 0
        wait_until(lambda: got.extend(m.value() for m in c.consume(100, timeout=0.5) if not m.error())
                   or len(got) >= i, 30, "every record consumed")
    finally:
        c.close()
    assert sorted(set(got)) == sorted(f"r{j}".encode() for j in range(i))
    # More successes than connections: the sessions were renewed.
    assert metric(b, 'keel_sasl_authentications_total{listener="SASL_PLAINTEXT",mechanism="PLAIN"}') >= 8
    assert metric(b, "keel_sasl_expired_sessions_closed_total") == 0
    # A client that does not re-authenticate is closed at its first
    # request after the session's end.
    conn = w.Conn(b.sasl_bootstrap)
    handshake(conn, "PLAIN")
    error, _, _, lifetime = authenticate(conn, b"\0alice\0alice-secret")
    assert (error, lifetime) == (0, 2000)
    conn.send(w.metadata_request_v1(7, []))
    assert conn.recv_response()[0] == 7
    time.sleep(2.2)
    conn.send(w.metadata_request_v1(8, []))
    assert conn.closed_by_peer()
    wait_until(lambda: "SASL session expired" in b.log_tail(), 10, "the expiry in the log")
    assert metric(b, "keel_sasl_expired_sessions_closed_total") == 1


def handshake(conn: w.Conn, mechanism: str, version: int = 1) -> tuple[int, list[str]]:
    conn.send(w.frame(w.header_v1(SASL_HANDSHAKE, version, 1) + w.string(mechanism)))
    _, body = conn.recv_response()
    r = w.Reader(body)
    error = r.i16()
    return error, [r.string() for _ in range(r.i32())]


def authenticate(conn: w.Conn, token: bytes) -> tuple[int, str | None, bytes, int]:
    """SaslAuthenticate v1: -> (error, message, token, session lifetime)."""
    conn.send(w.frame(w.header_v1(SASL_AUTHENTICATE, 1, 2) + w.nbytes(token)))
    _, body = conn.recv_response()
    r = w.Reader(body)
    return r.i16(), r.string(), r.bytes_(), r.i64()


def scram_sha512(conn: w.Conn, user: str, password: str) -> tuple[int, int]:
    """A SCRAM-SHA-512 exchange (RFC 5802) in SaslAuthenticate v1 frames
    after a handshake: -> (error, session lifetime)."""
    nonce = base64.b64encode(os.urandom(18)).decode()
    first_bare = f"n={user},r={nonce}"
    error, _, server_first, _ = authenticate(conn, f"n,,{first_bare}".encode())
    if error:
        return error, 0
    fields = dict(kv.split("=", 1) for kv in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha512")
    final_bare = f"c=biws,r={fields['r']}"
    auth_message = f"{first_bare},{server_first.decode()},{final_bare}".encode()
    signature = hmac.digest(hashlib.sha512(client_key).digest(), auth_message, "sha512")
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature))).decode()
    error, _, _, lifetime = authenticate(conn, f"{final_bare},p={proof}".encode())
    return error, lifetime


def metadata_served(conn: w.Conn, correlation_ids: list[int]) -> list[int]:
    """Sends Metadata requests one after another: -> the ids answered
    before the broker closed the connection."""
    answered = []
    for cid in correlation_ids:
        try:
            conn.send(w.metadata_request_v1(cid, []))
            answered.append(conn.recv_response()[0])
        except ConnectionError:
            break
    return answered


def test_an_unfinished_re_authentication_does_not_keep_an_expired_session(sasl_broker):
    """Issue 36: a SaslHandshake after the session's end, never followed
    by its tokens, kept the old session serving every request, even after
    its user's credential was deleted. As in Kafka (KIP-368), only the
    re-authentication's own frames are served after the session's end,
    and a re-authentication that fails closes the connection."""
    b = sasl_broker({"connections.max.reauth.ms": "2000", "connection.failed.authentication.delay.ms": "0"})
    add_scram(b.bootstrap, "erin", "erin-secret")
    stalled, failing = w.Conn(b.sasl_bootstrap), w.Conn(b.sasl_bootstrap)
    for conn in (stalled, failing):
        assert handshake(conn, "SCRAM-SHA-512")[0] == 0
        assert scram_sha512(conn, "erin", "erin-secret") == (0, 2000)
        assert metadata_served(conn, [7]) == [7]
    delete_scram(b.bootstrap, "erin")
    # The deleted credential cannot re-authenticate: the answer says so
    # and the connection closes.
    assert handshake(failing, "SCRAM-SHA-512")[0] == 0
    assert scram_sha512(failing, "erin", "erin-secret")[0] == SASL_AUTHENTICATION_FAILED
    assert failing.closed_by_peer()
    # A re-authentication begun after the session's end and never
    # finished does not extend it.
    time.sleep(2.2)
    assert handshake(stalled, "SCRAM-SHA-512")[0] == 0
    assert metadata_served(stalled, [8, 9, 10]) == []
    assert stalled.closed_by_peer()
    wait_until(lambda: "SASL session expired" in b.log_tail(), 10, "the expiry in the log")
    assert metric(b, "keel_sasl_expired_sessions_closed_total") == 1


def test_hostile_handshakes_are_closed_cleanly_and_the_broker_keeps_serving(sasl_broker):
    b = sasl_broker({"sasl.server.max.receive.size": "4096", "connection.failed.authentication.delay.ms": "0"})
    create_topic(b.bootstrap, "guarded", partitions=1)
    # A request before authentication: closed.
    conn = w.Conn(b.sasl_bootstrap)
    conn.send(w.metadata_request_v1(1, None))
    assert conn.closed_by_peer()
    # ApiVersions is allowed first, as Kafka allows it.
    conn = w.Conn(b.sasl_bootstrap)
    conn.send(w.api_versions_request(3, 5))
    assert conn.recv_response()[0] == 5
    # An unknown mechanism: UNSUPPORTED_SASL_MECHANISM naming the
    # enabled ones, then a close.
    assert handshake(conn, "GSSAPI") == (UNSUPPORTED_SASL_MECHANISM, ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
    assert conn.closed_by_peer()
    # SaslAuthenticate before a handshake: ILLEGAL_SASL_STATE, then a close.
    conn = w.Conn(b.sasl_bootstrap)
    assert authenticate(conn, b"\0alice\0alice-secret")[0] == ILLEGAL_SASL_STATE
    assert conn.closed_by_peer()
    # An oversized frame before authentication (over
    # sasl.server.max.receive.size, though under socket.request.max.bytes).
    conn = w.Conn(b.sasl_bootstrap)
    handshake(conn, "PLAIN")
    conn.send(w.i32(100_000) + b"\0" * 64)
    assert conn.closed_by_peer()
    # A truncated SASL frame, then the client goes away.
    with socket.create_connection(("127.0.0.1", b.sasl_port), timeout=10) as raw:
        raw.sendall(w.frame(w.header_v1(SASL_HANDSHAKE, 1, 1) + w.string("PLAIN")))
        raw.recv(1024)
        raw.sendall(w.i32(200) + w.i16(SASL_AUTHENTICATE) + w.i16(1))
    # Garbage SCRAM tokens: SASL_AUTHENTICATION_FAILED, then a close,
    # refused before the SASL library's parser (which panics on some).
    for token in [b"", b"n,,", b"n,,n=a", b"n,,n=a,", b"\xff" * 300, b"m=ext,,n=a,r=b"]:
        conn = w.Conn(b.sasl_bootstrap)
        assert handshake(conn, "SCRAM-SHA-512")[0] == 0
        assert authenticate(conn, token)[0] == SASL_AUTHENTICATION_FAILED, token
        assert conn.closed_by_peer()
    assert b"panicked" not in b.log_path.read_bytes()
    # A v0 handshake, then a bare PLAIN token: answered with a bare empty
    # token, after which requests are served.
    conn = w.Conn(b.sasl_bootstrap)
    assert handshake(conn, "PLAIN", version=0)[0] == 0
    conn.send(w.frame(b"\0alice\0alice-secret"))
    assert conn._recv_exact(4) == w.i32(0)
    conn.send(w.metadata_request_v1(9, ["guarded"]))
    assert conn.recv_response()[0] == 9
    # A wrong bare token: closed without an answer (v0 cannot carry one).
    conn = w.Conn(b.sasl_bootstrap)
    handshake(conn, "PLAIN", version=0)
    conn.send(w.frame(b"\0alice\0wrong"))
    assert conn.closed_by_peer()
    # The broker goes on serving every listener.
    assert len(round_trip(b.sasl_bootstrap, "guarded", sasl("PLAIN", "alice", "alice-secret"), n=5)) >= 5


def test_a_sasl_listener_without_usable_settings_is_refused_at_start_up(sasl_broker):
    for extra, says in [({"sasl.enabled.mechanisms": "GSSAPI"}, "Keel does not offer GSSAPI"),
                        ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": ""}, "PLAIN is enabled but has no users"),
                        ({"listener.name.sasl_ssl.plain.sasl.jaas.config": "nonsense"}, "control flag")]:
        b = sasl_broker(extra, start=False)
        b.data_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(b.command(), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and says in done.stderr + done.stdout, done.stderr[-2000:]
