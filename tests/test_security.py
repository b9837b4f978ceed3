"""Listeners and TLS with Kafka's keys: a PLAINTEXT and an SSL listener side
by side, each advertised to the clients that came in on it;
confluent-kafka and kafka-python over SSL with a PEM keystore; client
certificates (`ssl.client.auth=required`) checked against a PEM
truststore; a TLS handshake on the plaintext port and a plaintext request
on the TLS port closed cleanly; PKCS12 stores as keytool writes them;
keystores Keel cannot read refused at start-up with what to do. Certificates are made by the test."""
from __future__ import annotations

import json
import os
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient
from cryptography import x509
from cryptography.x509.oid import NameOID
from kafka import KafkaConsumer, KafkaProducer

import kafka_tools
import kafka_wire as w
import quota_wire as q
from conftest import IMPL, Broker, free_port, wait_until
from kclient import CLIENT_TIMEOUT_S, create_topic, round_trip
from pki import Pki

pytestmark = pytest.mark.skipif(IMPL != "keel", reason="Keel's listener flags")

class TlsBroker(Broker):
    """Keel with a PLAINTEXT listener on `port` and an SSL one on `ssl_port`."""

    def __init__(self, data_dir, log_path, sets):
        super().__init__(data_dir, log_path, sets=sets)
        self.ssl_port = free_port()
        while self.ssl_port == self.port:
            self.ssl_port = free_port()
        self.sets["listeners"] = f"PLAINTEXT://127.0.0.1:{self.port},SSL://127.0.0.1:{self.ssl_port}"
        self.sets["advertised.listeners"] = self.sets["listeners"]

    @property
    def ssl_bootstrap(self) -> str:
        return f"127.0.0.1:{self.ssl_port}"


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path)


@pytest.fixture
def tls_broker(tmp_path_factory, pki):
    made = []

    def make(extra: dict[str, str] | None = None, start: bool = True) -> TlsBroker:
        pki.leaf("broker", server=True)
        sets = {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(pki.dir / "broker.pem")}
        sets.update(extra or {})
        base = tmp_path_factory.mktemp("keel-tls")
        b = TlsBroker(base / "data", base / "broker.log", sets)
        made.append(b)
        if start:
            b.start()
        return b
    yield make
    for b in made:
        b.close()


def ssl_config(pki: Pki, client: tuple[str, str] | None = None) -> dict:
    c = {"security.protocol": "SSL", "ssl.ca.location": pki.ca}
    if client:
        c["ssl.certificate.location"], c["ssl.key.location"] = client
    return c


def advertised(bootstrap: str, extra: dict) -> tuple[str, int]:
    md = AdminClient({"bootstrap.servers": bootstrap, **extra}).list_topics(timeout=CLIENT_TIMEOUT_S)
    [b] = md.brokers.values()
    return b.host, b.port


def test_an_ssl_listener_beside_a_plaintext_one_serves_real_clients(tls_broker, pki):
    b = tls_broker()
    create_topic(b.bootstrap, "secure", partitions=2)
    got = round_trip(b.ssl_bootstrap, "secure", ssl_config(pki))
    assert sorted(got) == sorted(f"v{i}".encode() for i in range(200))
    # Each listener advertises itself to the clients that came in on it.
    assert advertised(b.ssl_bootstrap, ssl_config(pki)) == ("127.0.0.1", b.ssl_port)
    assert advertised(b.bootstrap, {}) == ("127.0.0.1", b.port)
    # kafka-python over SSL, checking the broker's name.
    tls = dict(security_protocol="SSL", ssl_cafile=pki.ca, ssl_check_hostname=True)
    producer = KafkaProducer(bootstrap_servers=b.ssl_bootstrap, **tls)
    for i in range(50):
        producer.send("secure", value=f"k{i}".encode())
    producer.flush(CLIENT_TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer("secure", bootstrap_servers=b.ssl_bootstrap, auto_offset_reset="earliest",
                             consumer_timeout_ms=10_000, **tls)
    values = {m.value for m in consumer}
    consumer.close()
    assert {f"k{i}".encode() for i in range(50)} <= values


def test_client_certificates_are_required_and_checked(tls_broker, pki):
    b = tls_broker({"ssl.client.auth": "required", "ssl.truststore.type": "PEM",
                    "ssl.truststore.location": pki.ca})
    create_topic(b.bootstrap, "mtls", partitions=1)
    good = pki.leaf("alice", server=False)
    assert len(round_trip(b.ssl_bootstrap, "mtls", ssl_config(pki, good), n=20)) == 20
    expired = pki.leaf("mallory", server=False, expired=True)
    for refused in [ssl_config(pki), ssl_config(pki, expired)]:
        errors, delivered = [], []
        p = Producer({"bootstrap.servers": b.ssl_bootstrap, "message.timeout.ms": 3000,
                      "error_cb": lambda e: errors.append(str(e)), **refused})
        p.produce("mtls", value=b"x", on_delivery=lambda e, m: delivered.append(e))
        p.flush(10)
        assert len(delivered) == 1 and delivered[0] is not None, \
            "a client without a valid certificate must not produce"
        assert errors, "the handshake failure is reported to the client"
    wait_until(lambda: "TLS handshake failed" in b.log_tail(), 10, "the refusal in the log")
    assert round_trip(b.ssl_bootstrap, "mtls", ssl_config(pki, good), n=5)
    # Counted by listener, as Kafka's failed-authentication-total.
    with urllib.request.urlopen(f"http://{b.admin}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    [line] = [l for l in metrics.splitlines() if l.startswith('keel_authentication_failures_total{listener="SSL"}')]
    assert float(line.split()[-1]) >= 2, line


def producer_throttle_ms(bootstrap: str, topic: str, extra: dict, n_bytes: int) -> int:
    """Produces `n_bytes` in 1 KiB records: -> the longest throttle time
    the broker asked of this client (librdkafka's statistics)."""
    seen = [0]

    def stats(js: str) -> None:
        for broker in json.loads(js)["brokers"].values():
            seen[0] = max(seen[0], broker.get("throttle", {}).get("max", 0))
    p = Producer({"bootstrap.servers": bootstrap, "statistics.interval.ms": 200, "stats_cb": stats,
                  "linger.ms": 5, **extra})
    for _ in range(n_bytes // 1024):
        p.produce(topic, value=b"x" * 1024)
        p.poll(0)
    assert p.flush(60) == 0
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        p.poll(0.2)
    return seen[0]


def test_a_client_certificate_names_the_user_its_quotas_apply_to(tls_broker, pki):
    """`ssl.principal.mapping.rules` maps a certificate's name to a user;
    that user's quota throttles it, and another user is not; a name no
    rule maps is refused."""
    b = tls_broker({"ssl.client.auth": "required", "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca,
                    "ssl.principal.mapping.rules": "RULE:^CN=([a-zA-Z]+)$/$1/L"})
    create_topic(b.bootstrap, "quoted", partitions=1)
    [(code, _, _)] = q.alter(b.bootstrap, [([("user", "alice")], [("producer_byte_rate", 2048.0, False)])])
    assert code == 0
    alice, bob = pki.leaf("Alice", server=False), pki.leaf("bob", server=False)
    assert producer_throttle_ms(b.ssl_bootstrap, "quoted", ssl_config(pki, alice), 96 << 10) > 0
    assert producer_throttle_ms(b.ssl_bootstrap, "quoted", ssl_config(pki, bob), 96 << 10) == 0
    # A name no rule maps: the connection is refused.
    stranger = pki.leaf("no-match-42", server=False)
    delivered = []
    p = Producer({"bootstrap.servers": b.ssl_bootstrap, "message.timeout.ms": 3000, **ssl_config(pki, stranger)})
    p.produce("quoted", value=b"x", on_delivery=lambda e, m: delivered.append(e))
    p.flush(10)
    assert delivered and delivered[0] is not None
    wait_until(lambda: "no ssl.principal.mapping.rules rule maps CN=no-match-42" in b.log_tail(), 10,
               "the refusal in the log")


def test_kafkas_own_console_clients_over_ssl_with_a_client_certificate(tls_broker, pki, tmp_path):
    """Apache Kafka's console producer and consumer (4.3.1, Java's TLS)
    with an SSL client config: PEM truststore and PEM keystore."""
    b = tls_broker({"ssl.client.auth": "required", "ssl.truststore.type": "PEM", "ssl.truststore.location": pki.ca})
    create_topic(b.bootstrap, "java-tls", partitions=2)
    cert, key = pki.leaf("java-client", server=False)
    keystore = tmp_path / "java-client.pem"
    keystore.write_bytes(Path(key).read_bytes() + Path(cert).read_bytes())
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SSL\n"
                      f"ssl.truststore.type=PEM\nssl.truststore.location={pki.ca}\n"
                      f"ssl.keystore.type=PEM\nssl.keystore.location={keystore}\n")
    java = ["java", "-Xmx256m", "-cp", kafka_tools.classpath(), f"-Dlog4j2.configurationFile={kafka_tools.LOG4J}"]
    lines = [f"line-{i}" for i in range(20)]
    produced = subprocess.run(java + ["org.apache.kafka.tools.ConsoleProducer", "--bootstrap-server", b.ssl_bootstrap,
                                      "--topic", "java-tls", "--command-config", str(config)],
                              input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=120)
    assert produced.returncode == 0, produced.stderr[-3000:]
    consumed = subprocess.run(java + ["org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server",
                                      b.ssl_bootstrap, "--topic", "java-tls", "--from-beginning",
                                      "--max-messages", str(len(lines)), "--timeout-ms", "30000",
                                      "--command-config", str(config)],
                              capture_output=True, text=True, timeout=120)
    assert consumed.returncode == 0, consumed.stderr[-3000:]
    assert sorted(consumed.stdout.split()) == sorted(lines), consumed.stdout


def test_the_wrong_protocol_on_either_port_is_closed_cleanly(tls_broker, pki):
    b = tls_broker()
    # A TLS handshake on the plaintext port: closed, not left waiting (a
    # socket timeout would be a hang).
    with socket.create_connection(("127.0.0.1", b.port), timeout=10) as raw:
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)) as closed:
            ssl.create_default_context(cafile=pki.ca).wrap_socket(raw, server_hostname="127.0.0.1")
        assert not isinstance(closed.value, TimeoutError), closed.value
    # A Kafka request on the TLS port.
    with socket.create_connection(("127.0.0.1", b.ssl_port), timeout=10) as raw:
        raw.sendall(w.api_versions_request(3, 1))
        try:
            answer = raw.recv(1024)
        except ConnectionError:
            answer = b""
        assert not answer.startswith(w.i32(len(answer) - 4)), "no Kafka answer on the TLS port"
    # Each refusal is logged (the client may see its close first).
    for line in ["TLS handshake on a PLAINTEXT listener", "TLS handshake failed"]:
        wait_until(lambda: line in b.log_tail(), 10, f"`{line}` in the log")
    # Both listeners go on serving.
    create_topic(b.bootstrap, "after", partitions=1)
    assert round_trip(b.ssl_bootstrap, "after", ssl_config(pki), n=5)


def peer_name(port: int, ca: str) -> str:
    """The common name of the certificate the listener on `port` shows."""
    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


def test_replaced_keys_are_picked_up_without_a_restart(tls_broker, pki):
    b = tls_broker()
    keystore = pki.dir / "broker.pem"
    assert peer_name(b.ssl_port, pki.ca) == "broker"
    # A file that does not load is logged, and the keys in use stay.
    keystore.write_text("not a key\n")
    wait_until(lambda: "cannot reload TLS keys" in b.log_tail(), 20, "the failed reload in the log")
    assert peer_name(b.ssl_port, pki.ca) == "broker"
    # New keys under the same file name: new connections get them.
    pki.leaf("broker-renewed", server=True)
    keystore.write_bytes((pki.dir / "broker-renewed.pem").read_bytes())
    wait_until(lambda: peer_name(b.ssl_port, pki.ca) == "broker-renewed", 20, "the renewed certificate")
    wait_until(lambda: "TLS keys reloaded" in b.log_tail(), 10, "the reload in the log")
    create_topic(b.bootstrap, "renewed", partitions=1)
    assert round_trip(b.ssl_bootstrap, "renewed", ssl_config(pki), n=5)


def test_the_admin_endpoint_over_tls_with_a_token(tls_broker, pki):
    b = tls_broker({"keel.admin.ssl.enabled": "true", "keel.admin.auth.bearer.token": "s3cret",
                    "listener.name.admin.ssl.keystore.type": "PEM",
                    "listener.name.admin.ssl.keystore.location": str(pki.dir / "broker.pem")})
    ctx = ssl.create_default_context(cafile=pki.ca)

    def get(path: str, token: str | None) -> int:
        request = urllib.request.Request(f"https://{b.admin}{path}")
        if token:
            request.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(request, context=ctx, timeout=10) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
    assert get("/metrics", None) == 401
    assert get("/metrics", "wrong") == 401
    assert get("/metrics", "s3cret") == 200
    assert get("/healthz", None) == 200


def test_an_admin_endpoint_other_hosts_reach_needs_auth_or_an_explicit_yes(tls_broker):
    b = tls_broker({"keel.admin.listen": f"0.0.0.0:{free_port()}"}, start=False)
    b.data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(b.command(), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and "keel.admin.allow.remote.without.auth=true" in done.stderr, done.stderr[-2000:]
    # With a token it starts, and `keel stats` sends KEEL_ADMIN_TOKEN.
    b.sets["keel.admin.auth.bearer.token"] = "s3cret"
    b.start()

    def stats(env: dict) -> subprocess.CompletedProcess:
        return subprocess.run([str(b.bin), "stats", "--admin", b.admin.replace("0.0.0.0", "127.0.0.1")],
                              capture_output=True, text=True, timeout=30, env={**os.environ, **env})
    assert stats({}).returncode != 0
    assert stats({"KEEL_ADMIN_TOKEN": "s3cret"}).returncode == 0
    b.stop()
    # Or with an explicit yes, and no token.
    del b.sets["keel.admin.auth.bearer.token"]
    b.sets["keel.admin.allow.remote.without.auth"] = "true"
    b.start()
    assert stats({}).returncode == 0


def test_an_encrypted_key_is_read_with_ssl_key_password(tls_broker, pki):
    pki.leaf("sealed", server=True, password=b"k3y-pass")
    sealed = str(pki.dir / "sealed.pem")
    assert b"ENCRYPTED PRIVATE KEY" in (pki.dir / "sealed.pem").read_bytes()
    b = tls_broker({"ssl.keystore.location": sealed, "ssl.key.password": "k3y-pass"})
    assert peer_name(b.ssl_port, pki.ca) == "sealed"
    for password, says in [("wrong", "cannot decrypt the key"), (None, "set ssl.key.password")]:
        extra = {"ssl.keystore.location": sealed}
        if password:
            extra["ssl.key.password"] = password
        other = tls_broker(extra, start=False)
        other.data_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(other.command(), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]


def test_pkcs12_stores_written_by_keytool_serve_with_client_certificates(tls_broker, pki):
    keystore, truststore = pki.pkcs12("broker12", "st0re-pass")
    stores = {"ssl.keystore.type": "PKCS12", "ssl.keystore.location": keystore,
              "ssl.keystore.password": "st0re-pass", "ssl.client.auth": "required",
              "ssl.truststore.type": "PKCS12", "ssl.truststore.location": truststore,
              "ssl.truststore.password": "st0re-pass"}
    b = tls_broker(stores)
    assert peer_name_with_client(b.ssl_port, pki, pki.leaf("carol", server=False)) == "broker12"
    create_topic(b.bootstrap, "p12", partitions=1)
    assert len(round_trip(b.ssl_bootstrap, "p12", ssl_config(pki, pki.leaf("alice", server=False)), n=10)) == 10
    # A wrong password fails the store's integrity check at start-up.
    for key, says in [("ssl.keystore.password", "ssl.keystore: the integrity check fails"),
                      ("ssl.truststore.password", "ssl.truststore: the integrity check fails")]:
        other = tls_broker({**stores, key: "wrong"}, start=False)
        other.data_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(other.command(), capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and says in done.stderr, done.stderr[-2000:]
        assert "st0re-pass" not in done.stderr + done.stdout


def peer_name_with_client(port: int, pki: Pki, client: tuple[str, str]) -> str:
    """The common name of the listener's certificate, over a handshake
    that presents the client certificate `client`."""
    ctx = ssl.create_default_context(cafile=pki.ca)
    ctx.load_cert_chain(*client)
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value


@pytest.mark.parametrize("sets, says", [
    ({"ssl.keystore.type": "JKS"}, "keytool -importkeystore"),
    ({"ssl.keystore.type": "PKCS12"}, "a PKCS12 keystore needs ssl.keystore.password"),
    ({"ssl.keystore.type": "PKCS12", "ssl.keystore.password": "x"}, "ssl.keystore: not a PKCS12 store"),
    ({"ssl.keystore.location": "/nonexistent/broker.pem"}, "/nonexistent/broker.pem"),
    ({"ssl.client.auth": "required"}, "needs ssl.truststore.location"),
    ({"ssl.enabled.protocols": "TLSv1.1"}, "TLSv1.1 is not supported"),
    ({"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SASL_SSL"}, "Keel does not offer GSSAPI"),
])
def test_what_keel_cannot_serve_is_refused_at_start_up(tls_broker, sets, says):
    b = tls_broker(sets, start=False)
    b.data_dir.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(b.command(), capture_output=True, text=True, timeout=60)
    assert done.returncode != 0 and says in done.stderr + done.stdout, done.stderr[-2000:]
